"""The start check (`verify_started`): a launch says `started` once its command is spawned, never before.

It waits on the event (the supervisor's pid file, written the moment the command is spawned, or the exit record
of a command that could not be), not on a fixed sleep. A command that ends at once after that is reported as
crashed by the next command (`orch status`, `orch logs`) and by `deploy --wait`; a playbook's `wait: S` also
makes the deploy itself watch the command for S seconds, counted from its own start, and fail it as crashed.
"""

from __future__ import annotations

import json
import os
import time

from tests.cli.test_lifecycle import wait_status

WINDOW = """name: deploy
steps:
  - step: push_revision
  - step: stop_run
  - step: record
  - step: start_run
  - step: verify_started
    wait: 0.5
"""


def deploy(project, command: str, *extra: str):
    return project.run("deploy", "--json", "--set", f"project.command={command}", *extra)


def test_a_command_that_exits_at_once_is_started_then_reported_crashed_by_the_next_command(project):
    res = deploy(project, "sh -c 'sleep 0.3; echo no data >&2; exit 4'")
    assert res.returncode == 0, res.stdout + res.stderr
    out = json.loads(res.stdout)
    assert out["experiment"]["status"] == "running"  # spawned: the launch line says started
    assert (project.run_dir(1) / "pid.json").exists()  # the deploy returned after the spawn, not before
    state = wait_status(project, 1, ("crashed",), timeout=30)
    assert state["exit_code"] == 4
    assert project.registry().get(1).status == "crashed" and project.registry().get(1).exit_code == 4
    logs = project.run("logs", "-e", "1")
    assert logs.returncode == 0 and "no data" in logs.stdout, logs.stdout + logs.stderr


def test_a_command_that_exits_at_once_fails_deploy_wait_as_crashed(project):
    res = deploy(project, "sh -c 'echo no data >&2; exit 4'", "--wait=20")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "crashed on local (exit code 4)" in res.stderr, res.stderr
    assert project.registry().get(1).status == "crashed" and project.registry().get(1).exit_code == 4


def test_a_command_that_cannot_be_started_fails_the_deploy(project):
    # an argument list: nothing is spawned, the exit record comes (an absolute path: a deploy does not check it
    # against the revision, as it does ./no-such-program)
    res = deploy(project, "['/opt/orch-test/no-such-program']")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "crashed on local (exit code 127)" in res.stderr, res.stderr
    assert project.registry().get(1).status == "crashed", res.stderr
    assert not (project.run_dir(1) / "pid.json").exists()


def test_the_default_check_waits_for_the_spawn_not_a_fixed_window(project):
    plan = json.loads(project.run("deploy", "--dry-run", "--json").stdout)
    assert plan["steps"][-1].endswith("verify_started: check the command was spawned"), plan["steps"]
    (project.path / "playbooks").mkdir()
    (project.path / "playbooks" / "deploy.yaml").write_text(WINDOW)
    plan = json.loads(project.run("deploy", "--dry-run", "--json").stdout)
    assert plan["steps"][-1].endswith("verify_started: check the run is alive after 0.5 s"), plan["steps"]


def test_a_playbook_window_still_fails_the_deploy_for_a_command_ending_inside_it(project):
    (project.path / "playbooks").mkdir()
    (project.path / "playbooks" / "deploy.yaml").write_text(WINDOW)
    # ends ~50 ms after it started: inside the 0.5 s window however late the check began looking
    res = deploy(project, "sh -c 'sleep 0.05; exit 5'")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "crashed on local (exit code 5)" in res.stderr, res.stderr
    project.configure(steps=100000, sleep=0.05)
    res = deploy(project, "python3 train.py")
    returned = time.time()
    assert res.returncode == 0, res.stdout + res.stderr
    spawned = os.stat(project.run_dir(2) / "pid.json").st_mtime
    assert returned - spawned >= 0.5 - 0.01  # a started run had lived the whole window
    assert project.run("stop").returncode == 0
