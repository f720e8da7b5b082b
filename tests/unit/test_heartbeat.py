"""A job's progress heartbeat between its nodes' supervisors: the packet, the progress rule, one real socket."""

from __future__ import annotations

import json
import socket

import pytest

from orchestrator.agent.run.attempts import Policy
from orchestrator.agent.run.heartbeat import Beacon, JobSpec, Progress, decode, encode, token
from orchestrator.agent.run.watchdog import stall_note

TOK = token("tinylm-exp7/r1")


def test_a_packet_round_trips_and_only_this_jobs_peer_packets_are_taken():
    assert encode(TOK, 1, 42, 18233) == f"orch-hb1 {TOK} 1 42 18233\n".encode()
    assert decode(encode(TOK, 1, 42, 18233), TOK, 2, 0) == (1, 42, 18233)
    other = token("tinylm-exp8/r1")  # another job on the same node and port
    assert other != TOK and decode(encode(other, 1, 42, 5), TOK, 2, 0) is None
    assert decode(encode(TOK, 0, 1, 5), TOK, 2, 0) is None  # its own packet
    assert decode(encode(TOK, 2, 1, 5), TOK, 2, 0) is None  # no such rank
    for bad in (b"", b"orch-hb1", f"orch-hb1 {TOK} 1 -3 5\n".encode(), f"orch-hb1 {TOK} 1 3 5 6\n".encode(),
                f"orch-hb1 {TOK} 1 3 1e9\n".encode(), f"orch-hb1 {TOK} 1 3 {'9' * 19}\n".encode(),
                f"orch-hb2 {TOK} 1 3 5\n".encode(), f"orch-hb1 {TOK.upper()} 1 3 5\n".encode(),
                encode(TOK, 1, 3, 5) + b"x" * 100, b"\xff" * 40):
        assert decode(bad, TOK, 2, 0) is None, bad


def test_the_job_moves_while_any_node_moves_and_stalls_when_none_does():
    p = Progress(newest=0.0)
    assert p.own_size(100, 1.0)  # its own log grew
    assert not p.own_size(100, 5.0)
    assert not p.stalled(8.9, 8) and p.stalled(9.0, 8)
    assert p.peer(1, 1, 0, 6.0, 1006.0)  # a peer first heard of: the job moved
    assert not p.peer(1, 2, 0, 7.0, 1007.0)  # alive, but its log did not grow: no progress
    assert p.peers[1].heard == 1007.0 and p.peers[1].moved == 1006.0
    assert p.peer(1, 3, 512, 12.0, 1012.0) and p.newest_by == 1  # it printed: the silent node is not stalled
    assert not p.stalled(19.9, 8) and p.stalled(20.0, 8)
    assert not p.peer(1, 2, 9999, 19.0, 1019.0)  # an older packet arriving late is no news
    assert not p.peer(1, 3, 9999, 19.0, 1019.0)  # nor a repeated one
    p.touch(19.5)  # being stopped
    assert not p.stalled(27.0, 8)


def test_a_job_spec_is_checked_like_any_request():
    good = {"id": "p-exp1/r1", "rank": 1, "addrs": ["10.0.0.1", "10.0.0.2"], "port": 29401}
    assert JobSpec.from_dict(good).token == token("p-exp1/r1")
    for bad in ({**good, "rank": 2}, {**good, "rank": "1"}, {**good, "rank": True}, {**good, "port": 0},
                {**good, "addrs": ["10.0.0.1"]}, {**good, "addrs": "10.0.0.1 10.0.0.2"}, {**good, "id": ""},
                {**good, "extra": 1}, None, []):
        with pytest.raises(ValueError):
            JobSpec.from_dict(bad)


def test_the_stall_note_names_the_job_rule():
    assert "on any node of the job for 8 s" in stall_note(Policy.from_dict({"stall_timeout": 8, "job": {"x": 1}}))
    assert stall_note(Policy.from_dict({"stall_timeout": 8})) == "[orch] no new log line for 8 s: stopped as stalled\n"


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_beacon_takes_its_peers_packets_drops_the_rest_and_records_them(tmp_path):
    port = _free_udp_port()
    spec = JobSpec("p-exp1/r1", 0, ("127.0.0.1", "127.0.0.1"), port)
    beacon = Beacon(spec, str(tmp_path)).open()
    assert beacon.error is None
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        progress = Progress(newest=0.0)
        for data in (encode(spec.token, 1, 1, 10), encode(token("other"), 1, 2, 99), b"junk",
                     encode(spec.token, 1, 2, 20)):
            peer.sendto(data, ("127.0.0.1", port))
        beacon.tick(0, progress, 5.0)  # sends its own packet to "node 1" = itself here: dropped as its own
        beacon.tick(0, progress, 5.1)
        assert progress.peers[1].size == 20 and progress.newest == 5.0 and progress.newest_by == 1
        assert beacon.dropped == 3
        saved = json.loads((tmp_path / "job.json").read_text())
        assert saved["peers"]["1"]["size"] == 20 and saved["error"] is None and saved["newest_by"] == 1
        busy = Beacon(spec, str(tmp_path)).open()  # the port is taken: judged on its own log, said why
        assert busy.sock is None and f"cannot listen on UDP port {port}" in busy.error
    finally:
        peer.close()
        beacon.close()
