"""How a run ended, named: a signal and its cause, on the local target (real tmux, the real CLI in a subprocess)."""

from __future__ import annotations

import json
import subprocess

from tests.cli.test_shared_target import SETS, job
from tests.conftest import tmux_socket, wait_for


def test_a_run_killed_by_the_tmux_server_going_away_names_the_signal_and_the_cause(project):
    job(project, "A", 0, sleep=600)
    assert project.run("deploy", *SETS).returncode == 0
    wait_for(lambda: (project.run_dir(1) / "pid.json").exists(), what="the run's start")
    subprocess.run(["tmux", "-L", tmux_socket(str(project.root)), "kill-server"], check=True)
    wait_for(lambda: (project.run_dir(1) / "exit.json").exists(), what="the recorded exit")
    res = project.run("status", "--no-metrics")
    assert res.returncode == 0, res.stderr
    assert "experiment 1 crashed (SIGHUP: the tmux server went away)" in res.stdout, res.stdout
    exp = project.registry().get(1)
    assert exp.exit_code == 129 and exp.end_reason == "SIGHUP: the tmux server went away"
    assert exp.ended == json.loads((project.run_dir(1) / "exit.json").read_text())["ended"]


def test_a_run_that_exits_non_zero_says_its_exit_code(project):
    job(project, "A", 3)
    project.run("deploy", *SETS, "--wait=20")
    res = project.run("status", "--no-metrics")
    assert "experiment 1 crashed (exit code 3)" in res.stdout, res.stdout


def test_a_plain_sigkill_is_not_blamed_on_the_oom_killer(project):
    job = "import os, signal\nprint('up', flush=True)\nos.kill(os.getpid(), signal.SIGKILL)\n"
    (project.path / "job.py").write_text(job)
    project.run("deploy", *SETS, "--wait=20")
    res = project.run("status", "--no-metrics")
    assert "experiment 1 crashed (SIGKILL)" in res.stdout, res.stdout
    exp = project.registry().get(1)
    assert exp.exit_code == 137 and exp.end_reason == "SIGKILL"
