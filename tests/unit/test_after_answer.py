"""Upkeep parked until a command's answer is out: only while holding, only the main thread's first closer, every
parked one run by ``finish``; and a registry parked this way is checkpointed when it closes."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from orchestrator import after_answer
from orchestrator.records.experiments import Registry


@pytest.fixture(autouse=True)
def not_holding():
    yield
    after_answer.finish()


def test_closers_run_at_once_unless_holding():
    ran = []
    after_answer.park(lambda: ran.append("now"))
    assert ran == ["now"]


def test_the_main_threads_first_closer_waits_for_finish_and_the_rest_run_at_once():
    ran = []
    after_answer.hold()
    after_answer.park(lambda: ran.append("first"))
    after_answer.park(lambda: ran.append("second"))
    thread = threading.Thread(target=after_answer.park, args=(lambda: ran.append("thread"),))
    thread.start()
    thread.join()
    assert ran == ["second", "thread"]
    after_answer.finish()
    assert ran == ["second", "thread", "first"]
    after_answer.park(lambda: ran.append("after"))  # finish stops holding
    assert ran[-1] == "after"


def test_a_parked_closer_that_fails_is_passed_over():
    after_answer.hold()
    after_answer.park(lambda: 1 / 0)
    after_answer.finish()


def test_a_parked_registry_keeps_what_was_written_and_is_checkpointed_when_it_closes(tmp_path: Path):
    path = tmp_path / ".orch" / "experiments.db"
    wal = Path(f"{path}-wal")
    after_answer.hold()
    with Registry(path, park=True) as reg:
        exp = reg.create(project="p", target="local", revision="abc", command="python3 train.py")
    assert wal.exists()  # parked: still open, so the log is not folded in yet
    with Registry(path, park=True) as reg:  # another connection while one is parked closes at once
        assert reg.get(exp.id).revision == "abc"
        reg.update(exp.id, status="running")
    assert wal.exists()
    db = sqlite3.connect(path)
    assert db.execute("SELECT status FROM experiments WHERE id = ?", (exp.id,)).fetchone() == ("running",)
    db.close()
    after_answer.finish()
    assert not wal.exists()  # the last close folded the log into the file and removed it


def test_a_registry_made_to_be_moved_is_whole_when_it_closes_even_while_holding(tmp_path: Path):
    """``experiments rebuild`` writes a new file and renames it over the registry: nothing of it may be left in a
    write-ahead log beside the old name."""
    new = tmp_path / ".experiments.db.rebuild-1"
    after_answer.hold()
    Registry.write_new(new, "0123456789ab", 1, [])
    assert [p.name for p in tmp_path.iterdir()] == [new.name]
    with Registry(tmp_path / "other.db") as reg:  # not the command's own (no park): closed at once too
        reg.create(project="p", target="local", revision="abc", command="python3 train.py")
    assert not Path(f"{tmp_path / 'other.db'}-wal").exists()


def test_what_the_process_becomes_prepares_before_the_answer_and_runs_last():
    ran = []
    assert not after_answer.become(lambda: ran.append("prepare"), lambda: ran.append("become"))  # not holding
    after_answer.hold()
    assert after_answer.become(lambda: ran.append("prepare"), lambda: ran.append("become"))
    assert not after_answer.become(lambda: ran.append("other"), lambda: ran.append("other"))  # one only
    after_answer.later(lambda: ran.append("later"))
    after_answer.park(lambda: ran.append("parked"))
    after_answer.answering()
    assert ran == ["prepare"]
    after_answer.finish()
    assert ran == ["prepare", "parked", "later", "become"]
    after_answer.answering()  # nothing queued any more
    assert ran == ["prepare", "parked", "later", "become"]


def test_a_command_that_finds_no_keeper_listens_as_the_keeper_before_its_answer_and_serves_after(monkeypatch):
    """In a process that goes on after its answer, a command that finds no keeper queues becoming it: the socket
    listens once ``answering`` ran (a command typed next finds it), and it serves (a list, a close) after ``finish``."""
    import os
    import tempfile

    from orchestrator import sockets
    from orchestrator.reach.keeper import client, place

    monkeypatch.setenv("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="orch-rt-", dir="/tmp"))
    monkeypatch.setattr(os, "setsid", lambda: None)  # the test process keeps its session
    monkeypatch.setattr(os, "chdir", lambda _path: None)
    after_answer.hold()
    assert client.keeper(30) is None  # none listens: this command goes direct, and will become the keeper
    assert client.keeper(30) is None  # asked again: no second keeper is queued or started
    path = place.socket_path()
    assert not path.exists() and not sockets.starting(path)  # no keeper process was started either
    after_answer.answering()
    sock = sockets.connect(path)
    assert sock is not None  # listening before the answer; it waits until the keeper serves
    sock.close()
    served = threading.Thread(target=after_answer.finish)
    served.start()
    (found,) = client.keepers()
    assert found["pid"] == os.getpid() and found["connections"] == []
    assert client.close(None) == 0  # nothing held; the keeper exits
    served.join(10)
    assert not served.is_alive() and not path.exists()


def test_a_command_that_goes_on_becomes_nothing_and_starts_what_it_would_have_become_at_once():
    ran = []
    after_answer.hold()
    assert after_answer.become(lambda: ran.append("prepare"), lambda: ran.append("become"),
                               lambda: ran.append("instead"))
    after_answer.goes_on()  # a followed log, a terminal: its end may be hours away
    assert ran == ["instead"]
    assert not after_answer.become(lambda: ran.append("other"), lambda: ran.append("other"))  # nothing more queued
    after_answer.answering()
    after_answer.finish()
    assert ran == ["instead"]
    after_answer.hold()  # the next command (a warm child's) starts afresh
    assert after_answer.become(lambda: ran.append("prepare"), lambda: ran.append("become"))


def test_a_following_command_that_finds_no_keeper_starts_a_keeper_process_told_what_it_reached(monkeypatch):
    """A command that goes on (``logs --follow``) and finds no keeper: a keeper process starts now (the socket
    listens while the command still runs), and it is told the connection and agent the command's first agent call
    reached; the command itself never takes the socket."""
    import os
    import tempfile
    import time

    from orchestrator.reach.keeper import client, place

    monkeypatch.setenv("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="orch-rt-", dir="/tmp"))
    told = []
    monkeypatch.setattr(client, "_tell", lambda path, asked: told.append(asked))
    monkeypatch.setattr(client, "_REACHED", [])
    monkeypatch.setattr(client, "_STARTED", {})
    after_answer.hold()
    assert client.keeper(30) is None  # none listens: this command would become the keeper
    client.ready({"host": "box"}, ["python3", "agent.pyz"])  # its first agent call reached the target
    after_answer.goes_on()
    try:
        deadline = time.monotonic() + 30
        while not (found := client.keepers()):
            assert time.monotonic() < deadline, "no keeper process came up while the command went on"
            time.sleep(0.05)
        assert found[0]["pid"] != os.getpid()
        assert {"spec": {"host": "box"}, "agent": ["python3", "agent.pyz"]} in told
        assert place.socket_path() not in client._ADOPTING
        after_answer.answering()
        after_answer.finish()  # nothing to become: returns at once
    finally:
        client.close(None)
        for _pid, tell in client._STARTED.values():
            if tell >= 0:
                os.close(tell)
