"""A launch never leaves nothing running without a way back: the real CLI in a subprocess, real tmux.

What can make the start fail is checked before the old run is touched; what fails anyway (here tmux
refusing the new session, after the old run was stopped and its checkpoints moved) puts the checkpoints
back and says what was stopped.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import wait_for


def _running_with_checkpoints(project) -> set[str]:
    project.configure(steps=100000, ckpt_every=5, sleep=0.05)
    res = project.run("deploy", "--json")
    assert res.returncode == 0, res.stderr
    wait_for(lambda: project.checkpoints.is_dir() and len(list(project.checkpoints.iterdir())) >= 2,
             what="checkpoints")
    return _names(project)


def _names(project) -> set[str]:
    return {p.name for p in project.checkpoints.iterdir() if not p.name.startswith(".")}


def _trash_entries(project) -> list[Path]:
    trash = Path(str(project.checkpoints) + ".trash")
    return sorted(trash.iterdir()) if trash.is_dir() else []


def test_a_start_that_would_fail_is_refused_before_the_old_run_is_touched(project):
    before = _running_with_checkpoints(project)
    project.run_dir(2).mkdir(parents=True)  # what a racing launch would have made
    res = project.run("restart", "--clean-checkpoints", "--yes")
    assert res.returncode == 6, res.stderr
    assert "already exists" in res.stderr and "nothing was stopped" in res.stderr
    assert before <= _names(project) and _trash_entries(project) == []
    with project.registry() as reg:
        assert reg.get(1).status == "running" and reg.get(2).status == "failed"
    assert json.loads(project.run("status", "--json").stdout)["state"] == "running"


def _failing_tmux(tmp: Path, before_failing: str = "") -> dict:
    """A PATH whose tmux is the real one, except that it refuses to create a session, or to hand the standby
    supervisor's session over to the run (``before_failing`` runs first, as sh)."""
    folder = tmp / "bin"
    folder.mkdir()
    real = shutil.which("tmux")
    wrapper = folder / "tmux"
    wrapper.write_text(f'#!/bin/sh\nfor a in "$@"; do {{ [ "$a" = new-session ] || [ "$a" = rename-session ]; }} && '
                       f'{{ {before_failing or ":"}; echo "create session failed: simulated" >&2; exit 1; }}; done\n'
                       f'exec {real} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


def test_a_start_that_fails_after_the_stop_puts_the_checkpoints_back(project, tmp_path):
    before = _running_with_checkpoints(project)
    res = project.run("restart", "--clean-checkpoints", "--yes", env=_failing_tmux(tmp_path))
    assert res.returncode != 0, res.stdout
    print(res.stderr)
    assert "experiment 1 was stopped by this launch" in res.stderr, res.stderr
    assert f"put back in {project.checkpoints}" in res.stderr, res.stderr
    assert "; to start it again: orch restart -e 1" in res.stderr, res.stderr
    assert before <= _names(project)  # every file is back (and a final one)
    assert _trash_entries(project) == []
    with project.registry() as reg:
        old, new = reg.get(1), reg.get(2)
    assert old.status == "stopped" and old.end_reason == "stopped by experiment 2 (whose start then failed)"
    assert new.status == "failed" and new.checkpoints_action == "restored" and new.checkpoints_entry is None
    # the run that never started is not "still running": the next launch goes ahead at once
    res = project.run("deploy", "--json")
    assert res.returncode == 0, res.stderr
    assert "still running" not in res.stderr
    assert json.loads(res.stdout)["experiment"]["status"] == "running"
    assert json.loads(project.run("status", "--json").stdout)["experiment"] == 3
    project.run("stop")


def test_a_failed_start_that_cannot_put_them_back_says_where_they_are(project, tmp_path):
    _running_with_checkpoints(project)
    trash = f"{project.checkpoints}.trash"
    # something writes a file of the same name as a moved checkpoint meanwhile: the restore refuses to overwrite
    clash = f'for f in {trash}/*/ckpt*; do touch "{project.checkpoints}/$(basename "$f")"; done'
    res = project.run("restart", "--clean-checkpoints", "--yes", env=_failing_tmux(tmp_path, clash))
    assert res.returncode != 0
    entry = _trash_entries(project)[0]
    assert f"the checkpoints it moved aside are in {entry}" in res.stderr, res.stderr
    assert f"orch checkpoints restore {entry.name} puts them back" in res.stderr, res.stderr
    with project.registry() as reg:
        new = reg.get(2)
    assert new.status == "failed" and new.checkpoints_action == "moved" and new.checkpoints_entry == str(entry)


def _paused_restart(project, tmp_path, env: dict | None = None):
    """``orch play`` of a restart that pauses after the old run was stopped and its checkpoints moved (the
    dangerous point: neither runs), as a subprocess; returns it once it is there."""
    marker = tmp_path / "marker"
    book = project.path / "pause.yaml"
    steps = ["preflight", "push_revision", "stop_run", "checkpoints", "record"]
    book.write_text("name: pause\nsteps:\n" + "".join(f"  - step: {s}\n" for s in steps)
                    + f'  - {{step: shell, argv: ["sh", "-c", "touch {marker}; sleep 2"]}}\n'
                    + "  - step: start_run\n  - step: verify_started\n")
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "play", str(book), "--clean-checkpoints",
                             "--yes"], cwd=project.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, **(env or {})))
    wait_for(marker.exists, what="the pause after the old run was stopped and the checkpoints moved")
    return proc


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP])
def test_a_launch_cut_after_the_old_run_stopped_starts_the_new_one_and_says_how_to_go_back(project, tmp_path, sig):
    """A Ctrl-C (or the terminal closed) once the old run is stopped: the target finishes the start, so one run of
    the project runs, and orch says so with the command that puts the old one back, which works."""
    _running_with_checkpoints(project)
    proc = _paused_restart(project, tmp_path)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    how = "interrupted" if sig == signal.SIGINT else "interrupted by SIGHUP"
    assert proc.returncode == (130 if sig == signal.SIGINT else 128 + sig), err
    assert f"{how}: new run 2 started (running); old run 1 stopped; " in err, err
    entry = _trash_entries(project)[0]
    assert f"checkpoints moved to {entry} (orch checkpoints restore {entry.name})" in err, err
    assert err.rstrip().endswith("; to go back: orch restart -e 1"), err
    assert "Ctrl-C again to leave now" in err, err
    with project.registry() as reg:
        assert reg.get(1).status == "stopped" and reg.get(2).status == "running"
    status = json.loads(project.run("status", "--json").stdout)
    assert (status["experiment"], status["state"]) == (2, "running")
    back = project.run("restart", "-e", "1", "--json")  # the command it gave
    assert back.returncode == 0, back.stderr
    again = json.loads(back.stdout)["experiment"]
    with project.registry() as reg:
        assert (again["id"], again["parent"], again["revision"]) == (3, 1, reg.get(1).revision)
        assert reg.get(2).status == "stopped" and reg.get(3).status == "running"
    project.run("stop")


def test_a_launch_cut_after_the_old_run_stopped_whose_start_fails_puts_the_checkpoints_back(project, tmp_path):
    """The start goes on after the Ctrl-C and fails (tmux refuses it): the checkpoints are put back, and orch gives
    the command that starts the old run again."""
    before = _running_with_checkpoints(project)
    proc = _paused_restart(project, tmp_path, env=_failing_tmux(tmp_path))
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted: new run 2 not started (tmux could not start it" in err and "old run 1 stopped" in err, err
    assert f"the checkpoints it moved aside were put back in {project.checkpoints}" in err, err
    assert err.rstrip().endswith("; to start it again: orch restart -e 1"), err
    assert before <= _names(project) and _trash_entries(project) == []
    with project.registry() as reg:
        assert reg.get(2).status == "failed" and reg.get(2).checkpoints_action == "restored"
        assert reg.get(1).status == "stopped" and reg.get(1).end_reason == "stopped by experiment 2"
