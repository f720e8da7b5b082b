"""`orch experiments list` over a long history: the newest page, how many more there are, and `--json` records
that are the complete ones, row for row, read through the real CLI from a real registry of 1,200 experiments."""

from __future__ import annotations

import json
import os

from orchestrator.records.experiments import listing
from orchestrator.records.launch_guard import LaunchGuard

ROWS = 1200


def _fill(project) -> None:
    """``ROWS`` experiments on two targets, with the shapes a history holds: finished, a failed interrupted launch, a
    launch whose process is gone (orphaned), a dirty git tree, a job's nodes, a secret, a sweep, a parent."""
    with project.registry() as reg, reg.batch():
        for i in range(ROWS):
            fields = dict(project="p", target="local" if i % 4 else "other", machine="local:m",
                          target_info={"kind": "local", "ct": i % 7}, revision=f"{i:064x}",
                          revision_files=[["train.py", "0" * 64, 10]] * (i % 5), command=["python3", "train.py", str(i)],
                          config={"project": {"secrets": ["TOKEN"] if i % 9 == 0 else []}},
                          batching={"strategy": ("megabatch", "sorted", None)[i % 3]}, status="finished", exit_code=0,
                          started=1700000000.0 + i, ended=1700000060.0 + i, message=f"run [bold]{i}[/bold]",
                          sweep=f"s{i // 100}" if i % 2 else None, parent=i if i > 1 and i % 10 == 0 else None,
                          git_commit="abc", git_dirty=bool(i % 2), git_diff="diff --git a b\n" * 3)
            if i % 50 == 3:
                fields.update(nodes=[{"rank": 0, "label": "a"}, {"rank": 1, "label": "b"}], gpus=[{"index": 0}])
            if i == ROWS - 2:
                fields.update(status="failed", exit_code=None, error="interrupted: the launch was cut short")
            if i == ROWS - 3:
                fields.update(status="launching", exit_code=None)
            reg.create(created=1700000000.0 + i, **fields)
    # the launching row's lock file, left behind by a killed launcher: free, so the row is orphaned
    guard = LaunchGuard(project.path / ".orch")
    guard.hold(ROWS - 2)
    os.close(guard.fd)  # as if the process died holding it: the kernel dropped the lock, the file stays


def test_the_listing_at_scale_shows_the_newest_page_and_says_how_many_more(project):
    _fill(project)
    shown = project.run("experiments", "list", env={"ORCH_WARM": "0", "COLUMNS": "60"})
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    ids = [int(line.split("│")[1]) for line in lines[3:-1]]
    assert ids == list(range(ROWS, ROWS - 50, -1)), ids  # the newest 50, newest first
    assert len(lines) == 50 + 4  # off a terminal: one line each, nothing cut however narrow COLUMNS is
    by_id = {int(line.split("│")[1]): [c.strip() for c in line.split("│")[1:-1]] for line in lines[3:-1]}
    assert by_id[ROWS - 1][1] == "failed (interrupted)" and by_id[ROWS - 2][1] == "orphaned"
    assert by_id[ROWS][4] == f"{ROWS - 1:064x}"[:10] and by_id[ROWS][5] == ("megabatch", "sorted", "-")[(ROWS - 1) % 3]
    assert by_id[ROWS - 10][9] == f"run [bold]{ROWS - 11}[/bold]"  # text as written: no markup read into it
    assert f"the newest 50 of {ROWS} experiments; {ROWS - 50} more (--limit {ROWS} lists them all)" in shown.stderr
    assert "orphaned: the orch that launched it was killed" in shown.stderr

    every = project.run("experiments", "list", "--limit", str(ROWS + 5), env={"ORCH_WARM": "0"})
    assert len(every.stdout.splitlines()) == ROWS + 4 and "more" not in every.stderr

    other = project.run("experiments", "list", "-t", "other", "--limit", "10", env={"ORCH_WARM": "0"})
    assert f"the newest 10 of {ROWS // 4} experiments on other" in other.stderr
    assert all(line.split("│")[4].strip() == "other" for line in other.stdout.splitlines()[3:-1])


def test_the_json_listing_at_scale_is_the_complete_record_of_each(project):
    _fill(project)
    done = project.run("experiments", "list", "--json", "--limit", str(ROWS), env={"ORCH_WARM": "0"})
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    with project.registry() as reg:
        expected = listing(reg, reg.list(limit=ROWS))  # each row read as a full model, as the record is defined
    assert listed == json.loads(json.dumps(expected, default=str))
    assert [r["id"] for r in listed] == list(range(ROWS, 0, -1))
    assert "git_diff" not in listed[0] and listed[0]["files"] == (ROWS - 1) % 5
    assert [r["orphaned"] for r in listed].count(True) == 1

    page = project.run("experiments", "list", "--json", "--limit", "3", env={"ORCH_WARM": "0"})
    assert [r["id"] for r in json.loads(page.stdout)] == [ROWS, ROWS - 1, ROWS - 2]
    assert f"{ROWS - 3} more" in page.stderr
