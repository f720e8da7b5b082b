"""Streamed pushes through the real agent process: bounded pieces, verified blobs, resume after a cut."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from orchestrator.agent.protocol import PROTOCOL, unframe
from orchestrator.reach.agent_client import AgentClient, Op, Stream
from orchestrator.agent.store import durability
from orchestrator.agent.layout import Layout
from orchestrator.errors import AgentError, InputError
from orchestrator.reach.transport.local import LocalTransport
from tests.conftest import wait_for


@pytest.fixture
def agent(tmp_path):
    client = AgentClient(LocalTransport(), str(tmp_path / "root"), sys.executable)
    client.one("hello")  # the agent is in place, so every call below runs it directly
    return client


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def stream_of(*parts: bytes) -> Stream:
    return Stream(sum(len(p) for p in parts), lambda: iter(parts))


def raw_call(agent: AgentClient, ops: list[dict], declared: int, sent: bytes) -> dict:
    """One agent call whose stdin ends after ``sent`` although ``declared`` bytes were announced: a cut link."""
    request = {"v": PROTOCOL, "root": agent.root, "ops": ops, "lock": None, "what": "push", "payload": declared}
    proc = subprocess.run([sys.executable, agent.agent_path], input=json.dumps(request).encode() + b"\n" + sent,
                          capture_output=True, timeout=60)
    envelope = unframe(proc.stdout)
    assert envelope is not None, proc.stderr
    return envelope


def test_a_stream_of_blobs_is_stored_each_verified(agent, tmp_path):
    blobs = [os.urandom(n) for n in (0, 1, (1 << 20) + 7, 3 << 20)]
    entries = [{"sha256": sha(b), "size": len(b), "offset": 0} for b in blobs]
    # the payload arrives in pieces that do not line up with blob boundaries
    whole = b"".join(blobs)
    pieces = [whole[i:i + 77_777] for i in range(0, len(whole), 77_777)]
    value = agent.call([Op("blobs_store", {"blobs": entries})], payload=stream_of(*pieces))[0]
    assert value == {"stored": 4, "bytes": len(whole)}
    for b in blobs:
        path = tmp_path / "root" / "blobs" / sha(b)
        assert path.read_bytes() == b and (path.stat().st_mode & 0o777) == 0o444
    # the push returned before the disk sync; a detached child syncs, then drops the push's journal
    wait_for(lambda: not [p.name for p in (tmp_path / "root" / "blobs").iterdir() if p.name.startswith(".")],
             what="the journal to be settled", timeout=60)


def test_a_cut_push_resumes_with_only_the_missing_bytes(agent, tmp_path):
    first, second = os.urandom(2 << 20), os.urandom(5 << 20)
    entries = [{"sha256": sha(first), "size": len(first)}, {"sha256": sha(second), "size": len(second)}]
    cut = len(first) + (3 << 20) + 123
    envelope = raw_call(agent, [{"op": "blobs_store", "args": {"blobs": entries}}], len(first) + len(second),
                        (first + second)[:cut])
    error = envelope["results"][0]["error"]
    assert "the push was cut" in error["message"] and "only what is still missing" in error["hint"]
    # the complete blob is published; the other kept its received bytes
    found = agent.one("blobs_missing", hashes=[e["sha256"] for e in entries])
    assert found == {"missing": [sha(second)], "partial": {sha(second): cut - len(first)}}
    offset = found["partial"][sha(second)]
    value = agent.call([Op("blobs_store", {"blobs": [{"sha256": sha(second), "size": len(second),
                                                      "offset": offset}]})],
                       payload=stream_of(second[offset:]))[0]
    assert value == {"stored": 1, "bytes": len(second) - offset}
    assert (tmp_path / "root" / "blobs" / sha(second)).read_bytes() == second
    assert agent.one("blobs_missing", hashes=[sha(second)]) == {"missing": [], "partial": {}}


def test_a_damaged_resume_is_refused_and_its_part_dropped(agent, tmp_path):
    data = os.urandom(3 << 20)
    entry = {"sha256": sha(data), "size": len(data)}
    raw_call(agent, [{"op": "blobs_store", "args": {"blobs": [entry]}}], len(data), data[:1 << 20])
    tampered = bytearray(data[1 << 20:])
    tampered[5] ^= 0xFF
    with pytest.raises(AgentError, match="arrived damaged") as err:
        agent.call([Op("blobs_store", {"blobs": [{**entry, "offset": 1 << 20}]})], payload=stream_of(bytes(tampered)))
    assert "deploy again" in (err.value.hint or "")
    assert agent.one("blobs_missing", hashes=[sha(data)]) == {"missing": [sha(data)], "partial": {}}
    assert not (tmp_path / "root" / "blobs" / sha(data)).exists()


def test_a_resume_from_more_than_the_target_holds_is_refused(agent):
    data = os.urandom(1 << 20)
    with pytest.raises(AgentError, match="partial copy"):
        agent.call([Op("blobs_store", {"blobs": [{"sha256": sha(data), "size": len(data), "offset": 1000}]})],
                   payload=stream_of(data[1000:]))


def test_two_pushes_of_the_same_blob_at_once_store_it_once(agent, tmp_path):
    data = os.urandom(16 << 20)
    entry = {"sha256": sha(data), "size": len(data), "offset": 0}
    errors: list[BaseException] = []

    def push() -> None:
        try:
            slow = (data[i:i + (1 << 20)] for i in range(0, len(data), 1 << 20))
            agent.call([Op("blobs_store", {"blobs": [entry]})], payload=Stream(len(data), lambda: slow))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=push) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert (tmp_path / "root" / "blobs" / sha(data)).read_bytes() == data


def _journal(root, hashes: list[str], boot: str, age: float = 0.0) -> None:
    path = root / "blobs" / ".pending-test.json"
    path.write_text(json.dumps({"boot_id": boot, "blobs": hashes, "created": 0}))
    if age:
        then = time.time() - age
        os.utime(path, (then, then))


def test_blobs_of_a_push_a_reboot_interrupted_are_sent_again(agent, tmp_path):
    root = tmp_path / "root"
    kept, suspect = os.urandom(1000), os.urandom(2000)
    files = [{"path": "a.py", "sha256": sha(kept), "size": 1000, "mode": 0o644},
             {"path": "b.bin", "sha256": sha(suspect), "size": 2000, "mode": 0o755}]
    from orchestrator.agent.protocol import manifest_id

    rev = manifest_id(files)
    agent.call([Op("blobs_store", {"blobs": [{"sha256": sha(kept), "size": 1000},
                                             {"sha256": sha(suspect), "size": 2000}]}),
                Op("revision_assemble", {"revision": rev, "files": files})], payload=kept + suspect)
    wait_for(lambda: not list((root / "blobs").glob(".pending-*")), what="the sync", timeout=60)
    # as if the machine had gone down before the sync of the push that stored `suspect`
    _journal(root, [sha(suspect)], boot="an-earlier-boot")
    found = agent.one("blobs_missing", hashes=[sha(kept), sha(suspect)])
    assert found["missing"] == [sha(suspect)]
    assert not (root / "blobs" / sha(suspect)).exists() and not (root / "blobs" / (sha(suspect) + ".x")).exists()
    assert not (root / "revisions" / rev).exists()  # its files were links to the suspect blob
    assert (root / "blobs" / sha(kept)).read_bytes() == kept
    assert not list((root / "blobs").glob(".pending-*"))


def test_a_journal_of_this_boot_keeps_its_blobs(agent, tmp_path):
    root = tmp_path / "root"
    data = os.urandom(5000)
    agent.call([Op("blobs_store", {"blobs": [{"sha256": sha(data), "size": 5000}]})], payload=data)
    _journal(root, [sha(data)], boot=durability.boot_id())  # a writer killed before its sync: same boot
    assert agent.one("blobs_missing", hashes=[sha(data)])["missing"] == []
    assert (root / "blobs" / ".pending-test.json").exists()  # young: its sync may still be running
    _journal(root, [sha(data)], boot=durability.boot_id(), age=durability.SETTLE_AFTER + 5)
    assert durability.recover(Layout(str(root))) == []
    assert not (root / "blobs" / ".pending-test.json").exists() and (root / "blobs" / sha(data)).exists()


# blobs the controller hashes while it sends them: the key names the part, the hash follows the bytes


def test_blobs_hashed_while_sent_are_stored_under_the_hash_that_follows_them(agent, tmp_path):
    blobs = [os.urandom(n) for n in (0, 5, (2 << 20) + 3)] + [b"same"] * 2
    entries = [{"key": f"{i:x}" * 8, "size": len(b), "offset": 0} for i, b in enumerate(blobs)]
    whole = b"".join(b + sha(b).encode() for b in blobs)
    pieces = [whole[i:i + 65_537] for i in range(0, len(whole), 65_537)]
    value = agent.call([Op("blobs_store", {"blobs": entries})], payload=stream_of(*pieces))[0]
    assert value == {"stored": 5, "bytes": sum(map(len, blobs)),
                     "hashes": {e["key"]: sha(b) for e, b in zip(entries, blobs)}}
    stored = tmp_path / "root" / "blobs"
    for b in blobs:
        assert (stored / sha(b)).read_bytes() == b and ((stored / sha(b)).stat().st_mode & 0o777) == 0o444
    assert agent.one("blobs_missing", hashes=[sha(b) for b in blobs]) == {"missing": [], "partial": {}}
    wait_for(lambda: not [p.name for p in stored.iterdir() if p.name.startswith(".")],
             what="no part and no journal left", timeout=60)


def test_a_blob_whose_bytes_do_not_match_the_hash_after_them_is_refused(agent, tmp_path):
    data = os.urandom(3 << 20)
    tampered = bytearray(data)
    tampered[1 << 20] ^= 0x01
    with pytest.raises(AgentError, match="arrived damaged") as err:
        agent.call([Op("blobs_store", {"blobs": [{"key": "ab" * 16, "size": len(data)}]})],
                   payload=stream_of(bytes(tampered), sha(data).encode()))
    assert "deploy again" in (err.value.hint or "")
    blobs = tmp_path / "root" / "blobs"
    assert not (blobs / sha(data)).exists() and not (blobs / sha(bytes(tampered))).exists()
    assert agent.one("blobs_missing", hashes=[], keys=["ab" * 16]) == {"missing": [], "partial": {},
                                                                       "partial_keys": {}}


def test_a_push_cut_before_a_hash_arrives_publishes_nothing_and_resumes_with_only_the_rest(agent, tmp_path):
    first, second = os.urandom(2 << 20), os.urandom(3 << 20)
    keys = ["1" * 32, "2" * 32]
    entries = [{"key": k, "size": len(b)} for k, b in zip(keys, (first, second))]
    whole = first + sha(first).encode() + second + sha(second).encode()
    declared = len(whole)
    # cut inside the second blob's hash: its bytes are all there, but nothing says what they should hash to
    envelope = raw_call(agent, [{"op": "blobs_store", "args": {"blobs": entries}}], declared, whole[:-10])
    error = envelope["results"][0]["error"]
    assert "the push was cut" in error["message"] and "only what is still missing" in error["hint"]
    found = agent.one("blobs_missing", hashes=[sha(first), sha(second)], keys=keys)
    assert found["missing"] == [sha(second)]  # the first is stored; the second waits for its hash
    assert found["partial_keys"] == {keys[1]: len(second)}
    value = agent.call([Op("blobs_store", {"blobs": [{"key": keys[1], "size": len(second), "offset": len(second)}]})],
                       payload=stream_of(sha(second).encode()))[0]
    assert value == {"stored": 1, "bytes": 0, "hashes": {keys[1]: sha(second)}}
    assert (tmp_path / "root" / "blobs" / sha(second)).read_bytes() == second


def test_blobs_hashed_while_sent_that_a_reboot_damaged_are_found_and_sent_again(agent, tmp_path):
    root = tmp_path / "root"
    began = time.time()
    intact, damaged, twin = os.urandom(3000), os.urandom(4000), os.urandom(5000)
    entries = [{"key": k * 32, "size": len(b)} for k, b in zip("abc", (intact, damaged, twin))]
    files = [{"path": "run.sh", "sha256": sha(twin), "size": len(twin), "mode": 0o755}]
    from orchestrator.agent.protocol import manifest_id

    agent.call([Op("blobs_store", {"blobs": entries}),
                Op("revision_assemble", {"revision": manifest_id(files), "files": files})],
               payload=stream_of(*(p for b in (intact, damaged, twin) for p in (b, sha(b).encode()))))
    wait_for(lambda: not list((root / "blobs").glob(".pending-*")), what="the sync", timeout=60)
    # as if the machine had gone down before that push's sync: its journal counts 2 blobs it could not name,
    # and one of them lost its content
    (root / "blobs" / ".pending-test.json").write_text(json.dumps({"boot_id": "an-earlier-boot", "blobs": [],
                                                                   "keyed": 2, "created": began}))
    blob = root / "blobs" / sha(damaged)
    blob.chmod(0o644)
    blob.write_bytes(bytes(len(damaged)))
    copy = root / "blobs" / (sha(twin) + ".x")  # the executable's twin, a copy of its blob
    copy.chmod(0o755)
    copy.write_bytes(bytes(len(twin)))
    found = agent.one("blobs_missing", hashes=[sha(intact), sha(damaged), sha(twin)])
    assert found["missing"] == [sha(damaged), sha(twin)]
    assert not blob.exists() and not copy.exists() and (root / "blobs" / sha(intact)).read_bytes() == intact
    assert not (root / "revisions" / manifest_id(files)).exists()  # built from the damaged twin
    assert not list((root / "blobs").glob(".pending-*"))


def test_the_stored_blobs_of_a_size_are_told_so_that_a_file_not_hashed_yet_may_be_one(agent):
    data = os.urandom(4096)
    agent.call([Op("blobs_store", {"blobs": [{"sha256": sha(data), "size": len(data)}]})], payload=data)
    found = agent.one("blobs_missing", hashes=[], sizes=[4096, 17])
    assert found["sized"] == {"4096": [sha(data)]}


def test_a_bad_key_is_refused_before_anything_is_stored(agent, tmp_path):
    with pytest.raises(InputError, match="is not a key"):
        agent.call([Op("blobs_store", {"blobs": [{"key": "../../etc", "size": 3}]})], payload=b"abc")
    blobs = tmp_path / "root" / "blobs"
    assert not blobs.exists() or not [p for p in blobs.iterdir() if p.name.startswith(".part")]


def test_a_push_of_a_few_small_blobs_syncs_each_before_it_takes_its_name_and_a_bigger_one_keeps_the_journal(
        tmp_path, monkeypatch):
    """A one-line change's blob is on disk before it has its name (then its folder): no pending journal, no child
    syncing the whole filesystem while the run starts. A push of more blobs takes the journal's way as before."""
    from orchestrator.agent.store import blob_stream

    layout = Layout(str(tmp_path / "root"))
    events: list[tuple[str, str]] = []
    real_fsync, real_replace, real_fork = os.fsync, os.replace, os.fork

    def fsync(fd: int) -> None:
        events.append(("fsync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
        real_fsync(fd)

    def replace(src, dst) -> None:
        events.append(("name", os.path.basename(str(dst))))
        real_replace(src, dst)

    def fork() -> int:
        events.append(("fork", ""))
        return real_fork()

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "fork", fork)
    small = [os.urandom(300), os.urandom(700)]
    got = blob_stream.store(layout, b"".join(small), [{"sha256": sha(d), "size": len(d)} for d in small])
    assert got == {"stored": 2, "bytes": 1000}
    names = [sha(d) for d in small]
    assert events == [("fsync", f".part-{names[0]}"), ("name", names[0]), ("fsync", f".part-{names[1]}"),
                      ("name", names[1]), ("fsync", "blobs")]
    assert not list((tmp_path / "root" / "blobs").glob(".pending-*"))
    assert all((tmp_path / "root" / "blobs" / n).read_bytes() == d for n, d in zip(names, small))

    events.clear()
    many = [os.urandom(100 + i) for i in range(blob_stream.SYNCED_COUNT + 1)]
    blob_stream.store(layout, b"".join(many), [{"sha256": sha(d), "size": len(d)} for d in many])
    assert [e for e in events if e[0] == "fsync"][0][1].startswith(".pending-")  # the journal, first
    assert ("fork", "") in events  # its sync in a child
    assert not any(e == ("fsync", f".part-{sha(many[0])}") for e in events)
