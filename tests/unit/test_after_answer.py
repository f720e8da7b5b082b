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
