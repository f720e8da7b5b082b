"""Who wrote a checkpoint file, from the runs' records on the target and the file's mtime (agent/ckpt/ckpt_writers)."""

from __future__ import annotations

from orchestrator.agent.ckpt.ckpt_writers import is_run, writer_of, written_by

THREE = {"id": 3, "registry": "r1", "clone": None, "started": 100.0, "ended": 200.0}
FOUR = {"id": 4, "registry": "r1", "clone": None, "started": 200.5, "ended": None}


def test_the_run_running_at_the_files_mtime_wrote_it_even_a_moment_before_the_next_one_started():
    runs = [THREE, FOUR]
    assert writer_of(150.0, runs)["id"] == 3
    assert writer_of(199.9, runs)["id"] == 3  # its last checkpoint, on the stop, within the slack of the next start
    assert writer_of(200.4, runs)["id"] == 4  # between the two: the slack, and the later start, decide
    assert writer_of(5000.0, runs)["id"] == 4  # still running
    assert writer_of(50.0, runs) is None  # before any run of the folder: nobody orch knows


def test_a_writer_of_another_clone_is_named_as_such():
    other = {"id": 4, "registry": "r2", "clone": {"host": "laptop", "path": "/p"}, "started": 0.0, "ended": 1.0}
    assert not is_run(other, 4, "r1") and is_run(other, 4, "r2") and is_run({**other, "registry": None}, 4, "r1")
    assert written_by(other, "r1") == "written by experiment 4 of another clone of this project (laptop, /p)"
    assert written_by(FOUR, "r1") == "written by experiment 4"
