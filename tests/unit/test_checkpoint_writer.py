"""Which run wrote a checkpoint folder's newest file, from the target's run records (pure)."""

from orchestrator.checkpoints import Writer, writer as checkpoint_writer

MINE = {"host": "box", "path": "/home/me/proj"}
THEIRS = {"host": "box", "path": "/home/me/proj-copy"}
INV = {"path": "/ck/tinylm", "files": 2, "newest_mtime": 1001.0}


def run(id: int, started: float, ended: float | None, clone: dict, ck: str = "/ck/tinylm") -> dict:
    return {"id": id, "started": started, "ended": ended, "clone": clone, "checkpoints": ck}


def test_the_run_started_last_before_the_newest_file_wrote_it_whatever_the_numbers():
    runs = [run(29, 900.0, 1000.0, MINE), run(3, 1000.0, None, THEIRS)]
    writer = checkpoint_writer(runs, INV, MINE)
    assert writer == Writer(3, THEIRS)
    assert str(writer) == "experiment 3 of another clone of this project (box, /home/me/proj-copy)"


def test_own_runs_read_plainly_and_other_folders_do_not_count():
    runs = [run(4, 990.0, None, MINE), run(9, 995.0, None, THEIRS, ck="/ck/other")]
    assert str(checkpoint_writer(runs, INV, MINE)) == "experiment 4"
    assert checkpoint_writer(runs, {**INV, "files": 0}, MINE) is None
    assert checkpoint_writer([], INV, MINE) is None
