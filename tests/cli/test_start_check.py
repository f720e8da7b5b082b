"""The start check (`verify_started`): a launch says `started` only for a command that is up and did not end at once.

Its window counts from the command's own start (the supervisor's pid file), so a command that ends within it is
reported as crashed by the deploy itself, and one still up when the deploy returns has lived the whole window.
"""

from __future__ import annotations

import json
import os
import time


def deploy(project, command: str, *extra: str):
    return project.run("deploy", "--json", "--set", f"project.command={command}", *extra)


def test_a_command_that_exits_at_once_fails_the_deploy_as_crashed(project):
    res = deploy(project, "sh -c 'echo no data >&2; exit 4'")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "crashed on local (exit code 4)" in res.stderr, res.stderr
    assert project.registry().get(1).status == "crashed" and project.registry().get(1).exit_code == 4


def test_a_command_that_cannot_be_started_fails_the_deploy(project):
    res = deploy(project, "./no-such-program")
    assert res.returncode == 1, res.stdout + res.stderr
    assert project.registry().get(1).status == "crashed", res.stderr


def test_a_command_ending_inside_the_window_counted_from_its_start_is_a_crash(project):
    # ends ~50 ms after it started: inside the default 0.1 s window however late the check began looking
    res = deploy(project, "sh -c 'sleep 0.05; exit 5'")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "crashed on local (exit code 5)" in res.stderr, res.stderr


def test_a_started_run_had_lived_the_whole_window_when_the_deploy_returned(project):
    project.configure(steps=100000, sleep=0.05)
    res = deploy(project, "python3 train.py")
    returned = time.time()
    assert res.returncode == 0, res.stdout + res.stderr
    out = json.loads(res.stdout)
    assert out["experiment"]["status"] == "running"
    spawned = os.stat(project.run_dir(1) / "pid.json").st_mtime
    assert returned - spawned >= 0.1 - 0.01  # the window (less the file time's coarse clock)
    assert project.run("stop").returncode == 0
