"""Two clones of one project (same [project] name, same target root, each its own registry): their runs are
keyed by registry, so rows, logs and exit codes never mix, and a deploy that stops the other clone's run
says whose it was."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys

import pytest

from tests.conftest import Project, wait_for

JOB = "import sys, time\nprint('{who}-run started', flush=True)\ntime.sleep({sleep})\nsys.exit({code})\n"
SETS = ["--set", "project.sources=['job.py']", "--set", "project.command=python3 job.py"]


@pytest.fixture
def clones(project, tmp_path):
    """(A, B): the project and a second clone of it beside, sharing its target root."""
    other = Project(tmp_path / "clone", project.root)
    shutil.copytree(project.path, other.path, ignore=shutil.ignore_patterns(".orch"))
    for p in (project, other):
        p.configure(lock_timeout=30)
    return project, other


def job(p: Project, who: str, code: int, sleep: float = 0.0) -> None:
    (p.path / "job.py").write_text(JOB.format(who=who, code=code, sleep=sleep))


def status(p: Project) -> dict:
    res = p.run("status", "--json", "--no-metrics")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_interleaved_deploys_never_mix_rows_logs_or_exit_codes(clones):
    a, b = clones
    job(a, "A", 3)
    job(b, "B", 5)
    for p in (a, b, a, b, a):
        res = p.run("deploy", *SETS, "--wait=20")
        assert "crashed on local (exit code" in res.stderr, res.stdout + res.stderr
    for p in (a, b):
        status(p)
    rows_a, rows_b = a.registry().list(), b.registry().list()
    assert sorted(e.id for e in rows_a) == [1, 2, 3] and sorted(e.id for e in rows_b) == [1, 2]
    assert {e.exit_code for e in rows_a} == {3} and {e.exit_code for e in rows_b} == {5}
    assert {e.status for e in rows_a + rows_b} == {"crashed"}
    for p, who, other in ((a, "A", "B"), (b, "B", "A")):
        for n in (1, 2):
            log = p.run("logs", "-e", str(n))
            assert log.returncode == 0 and f"{who}-run started" in log.stdout and f"{other}-run" not in log.stdout
    assert not (a.root / "runs" / "1").exists()  # no plain numbered folders any more


def test_a_deploy_that_stops_the_other_clones_run_says_so(clones):
    a, b = clones
    job(a, "A", 0, sleep=600)
    job(b, "B", 0, sleep=600)
    assert a.run("deploy", *SETS).returncode == 0
    assert status(a)["state"] == "running"
    res = b.run("deploy", *SETS)
    assert res.returncode == 0, res.stderr
    assert f"stopped experiment 1 of another clone of this project ({socket.gethostname()}, {a.path})" \
        in res.stdout + res.stderr
    assert status(b)["state"] == "running" and b.registry().get(1).status == "running"
    assert status(a)["state"] == "stopped" and a.registry().get(1).status == "stopped"
    stop = a.run("stop")  # A's stop stops the project's run, B's: it says so too
    assert stop.returncode == 0 and "of another clone of this project" in stop.stdout, stop.stdout + stop.stderr
    assert status(b)["state"] == "stopped" and a.registry().get(1).status == "stopped"


def test_racing_deploys_from_two_clones_leave_the_records_true(clones):
    a, b = clones
    job(a, "A", 0, sleep=600)
    job(b, "B", 0, sleep=600)
    procs = [subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "deploy", *SETS], cwd=p.path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for p in (a, b)]
    outs = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outs
    assert "already exists" not in "".join(o + e for o, e in outs)
    states = sorted([status(a)["state"], status(b)["state"]])
    assert states == ["running", "stopped"]  # the second stopped the first; both registries say so
    running = [r for r in a.run_dir(1).parent.iterdir() if not (r / "exit.json").exists()]
    assert len(running) == 1


WRITER = ("import os, sys, time\nck = os.environ['ORCH_CHECKPOINT_DIR']\nos.makedirs(ck, exist_ok=True)\n"
          "open(os.path.join(ck, 'ckpt-{who}.pt'), 'w').write('{who}')\nprint('{who} wrote', flush=True)\n"
          "time.sleep(600)\n")


def test_checkpoints_written_by_the_other_clones_run_are_named_as_its(clones):
    """A's experiments 1 and 2 ran; B's experiment 1 started after them and wrote the newest checkpoint. B's
    numbers are its own: the question about the folder must name B's run as the other clone's, not A's 2."""
    a, b = clones
    for p, who in ((a, "A1"), (a, "A2"), (b, "B1")):  # B's deploy stops A's 2
        (p.path / "job.py").write_text(WRITER.format(who=who))
        assert p.run("deploy", *SETS).returncode == 0
        wait_for(lambda: (a.checkpoints / f"ckpt-{who}.pt").exists(), timeout=20, what=f"{who}'s checkpoint")
    res = a.run("restart", "--clean-checkpoints", "--dry-run")
    assert res.returncode == 0, res.stderr
    text = res.stdout + res.stderr
    assert f"written by experiment 1 of another clone of this project ({socket.gethostname()}, {b.path})" in text, text
    assert "written by experiment 2" not in text
    res = b.run("restart", "--clean-checkpoints", "--dry-run")
    assert res.returncode == 0 and "written by experiment 1: moved" in res.stdout, res.stdout + res.stderr
    assert b.run("stop").returncode == 0
