"""The supervisor's stall watchdog with a real silent process and a real UDP peer: a node of a job that
prints nothing lives while a peer's log grows, and is stopped as stalled once no node moves."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time

import pytest

from orchestrator.agent.run import watchdog
from orchestrator.agent.run.attempts import Policy
from orchestrator.agent.run.heartbeat import encode, token

SILENT = ["python3", "-c", "import time; time.sleep(60)"]


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _peer(port: int, job: str, beats: int, child: subprocess.Popen, seen: list) -> None:
    """Node 1: its log grows by 100 bytes a beat, then it stops moving (and sending)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for seq in range(1, beats + 1):
            s.sendto(encode(token(job), 1, seq, 100 * seq), ("127.0.0.1", port))
            time.sleep(0.2)
    seen.append(child.poll())  # still running when the job stopped moving?


def _watch(tmp_path, policy: Policy, beats: int) -> tuple[bool, list]:
    (tmp_path / "train.log").write_bytes(b"")
    child = subprocess.Popen(SILENT, start_new_session=True)
    seen: list = []
    port = (policy.job or {}).get("port") or _free_udp_port()
    peer = threading.Thread(target=_peer, args=(port, (policy.job or {}).get("id", "x"), beats, child, seen))
    peer.start()
    with open(tmp_path / "train.log", "ab", buffering=0) as log:
        code, stalled = watchdog.watch(child, str(tmp_path), policy, [], log)
    peer.join()
    assert code != 0
    return stalled, seen


def test_a_silent_node_lives_while_a_peer_moves_and_stalls_when_no_node_moves(tmp_path):
    port = _free_udp_port()
    job = {"id": "p-exp1/r1", "rank": 0, "addrs": ["127.0.0.1", "127.0.0.1"], "port": port}
    policy = Policy.from_dict({"stall_timeout": 1.5, "term_timeout": 1, "job": job})
    stalled, seen = _watch(tmp_path, policy, beats=20)  # 4 s of a moving peer: well past its own 1.5 s
    assert stalled and seen == [None]  # alive until the job stopped moving, then stopped as stalled
    heard = json.loads((tmp_path / "job.json").read_text())
    assert heard["peers"]["1"]["size"] == 2000 and heard["error"] is None and heard["port"] == port
    assert heard["dropped"] >= 1  # its own heartbeats came back to it here (node 1's address is its own)


def test_a_single_run_still_judges_its_own_log_alone(tmp_path):
    policy = Policy.from_dict({"stall_timeout": 1.5, "term_timeout": 1})
    stalled, seen = _watch(tmp_path, policy, beats=20)  # packets on some port: not its business
    assert stalled and seen[0] is not None  # stopped while the packets still came
    assert not (tmp_path / "job.json").exists()


def test_a_node_that_hears_no_peer_says_so_as_it_stalls(tmp_path):
    port = _free_udp_port()
    job = {"id": "p-exp1/r1", "rank": 1, "addrs": ["127.0.0.1", "127.0.0.1"], "port": port}
    policy = Policy.from_dict({"stall_timeout": 1, "term_timeout": 1, "job": job})
    stalled, _ = _watch(tmp_path, policy, beats=1)  # the "peer" sends as node 1, itself: nothing is taken
    assert stalled
    assert f"no heartbeat came from the job's other nodes (UDP port {port})" in (tmp_path / "train.log").read_text()


def _times_out_then_exits(seconds: float, code: int) -> subprocess.Popen:
    """A command that exits with ``code`` after ``seconds``: ``wait_child`` times out on it first, then gives its
    code; it is reaped when this returns."""
    child = subprocess.Popen(["python3", "-c", f"import time, sys; time.sleep({seconds}); sys.exit({code})"])
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            watchdog.wait_child(child, 0.01)
        assert watchdog.wait_child(child, 30) == code
    finally:
        child.kill()
        child.wait()
    return child


def test_wait_child_is_woken_by_the_exit_and_answers_as_popens_wait(monkeypatch):
    """The supervisor's wait for its command: the same codes and timeouts as ``Popen.wait``, but woken by the exit
    (a pidfd), never napping between looks as Popen's wait with a timeout does (up to 50 ms between them: a stop's
    exit record came that much after the command's end)."""
    naps: list[float] = []
    real_sleep = time.sleep
    monkeypatch.setattr(time, "sleep", lambda s: (naps.append(s), real_sleep(s)))

    child = _times_out_then_exits(0.3, 7)
    assert naps == []  # the waits slept in select on the pidfd, not in Popen's poll loop
    assert watchdog.wait_child(child, 1) == 7  # already reaped: its code again

    killed = subprocess.Popen(SILENT)
    killed.send_signal(9)
    assert watchdog.wait_child(killed, 30) == -9


def test_wait_child_without_pidfds_is_popens_wait(monkeypatch):
    """An older kernel or Python (no pidfd): Popen's own wait, with the same answers."""
    def refused(_pid: int) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(watchdog.os, "pidfd_open", refused)
    assert _times_out_then_exits(0.2, 5).returncode == 5
