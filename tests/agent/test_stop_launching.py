"""A stop that comes while a run is still launching (its supervisor not up yet: a deploy cut short, a loaded
target) ends it for good: the stop reports it stopped, it reads stopped from then on, and a supervisor that comes
up later never starts its command. Before, the stop reported it stopped, the supervisor then started it anyway, and
the next launch was refused with "experiment N is still running" beside "N was stopped by this launch"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.agent.run import runs
from orchestrator.agent.layout import Layout, write_json

REPO = Path(__file__).resolve().parents[2]


def launching_run(root: Path, marker: Path) -> tuple[Layout, str]:
    """A run folder as ``runs.start`` leaves it before its supervisor has written its pid file."""
    layout = Layout(str(root))
    layout.ensure()
    run_dir = layout.run_dir(7, "0123456789ab")
    os.makedirs(run_dir)
    write_json(os.path.join(run_dir, "experiment.json"), {"id": 7, "project": "p"})
    command = [sys.executable, "-c", f"open({str(marker)!r}, 'w').write('ran'); import time; time.sleep(60)"]
    write_json(os.path.join(run_dir, "launch.json"), {"argv": command, "cwd": str(root), "env": {},
                                                     "created": time.time(), "recovery": {}})
    return layout, run_dir


def supervise(run_dir: str) -> subprocess.CompletedProcess:
    code = f"import sys; from orchestrator.agent.run import runs; sys.exit(runs.supervise({run_dir!r}))"
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)


def test_a_run_stopped_while_launching_reads_stopped_and_its_late_supervisor_never_starts_it(tmp_path):
    marker = tmp_path / "ran"
    layout, run_dir = launching_run(tmp_path / "root", marker)
    assert runs.run_state(run_dir)["state"] == "launching"

    said = runs.stop(layout, "p", None, stop_timeout=1, term_timeout=1)

    assert [(r["id"], r["state"]) for r in said["stopped"]] == [(7, "stopped")]
    assert runs.run_state(run_dir)["state"] == "stopped"
    assert runs.alive_runs(layout, "p") == []  # the next launch is not refused because of it
    done = supervise(run_dir)  # the supervisor comes up after the stop gave up waiting for it
    assert done.returncode == 0, done.stderr
    assert not marker.exists(), "the command of a stopped run was started"
    assert runs.run_state(run_dir)["state"] == "stopped"
    assert runs.alive_runs(layout, "p") == []


def test_a_supervisor_that_sees_the_stop_marker_first_does_not_start_the_command(tmp_path):
    """The stop's marker is written and the supervisor comes up before the stop has given up waiting."""
    marker = tmp_path / "ran"
    _layout, run_dir = launching_run(tmp_path / "root", marker)
    write_json(os.path.join(run_dir, "stop_requested"), {"time": time.time(), "by": None})

    done = supervise(run_dir)

    assert done.returncode == 0, done.stderr
    assert not marker.exists()
    state = runs.run_state(run_dir)
    assert state["state"] == "stopped" and state["error"] == runs.BEFORE_START
    assert runs.BEFORE_START in Path(run_dir, runs.LOG).read_text()
    assert json.loads(Path(run_dir, "exit.json").read_text())["not_started"] is True


def test_a_run_stopped_once_running_still_reads_stopped_with_its_exit_code(tmp_path):
    """The plain path is unchanged: a started run is signalled and records its own exit."""
    marker = tmp_path / "ran"
    layout, run_dir = launching_run(tmp_path / "root", marker)
    proc = subprocess.Popen([sys.executable, "-c", f"import sys; from orchestrator.agent.run import runs; "
                             f"sys.exit(runs.supervise({run_dir!r}))"], cwd=REPO)
    try:
        deadline = time.monotonic() + 30
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists()
        said = runs.stop(layout, "p", None, stop_timeout=5, term_timeout=2)
        assert [(r["id"], r["state"]) for r in said["stopped"]] == [(7, "stopped")]
        assert said["stopped"][0]["signals"] and said["stopped"][0]["exit_code"] is not None
        assert "not_started" not in json.loads(Path(run_dir, "exit.json").read_text())
    finally:
        proc.kill()
        proc.wait()
