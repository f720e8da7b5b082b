"""Every command that reaches a target brings every unsettled row of the registry up to date, however old,
with who stopped the run and its real end time (real CLI in a subprocess, real tmux, two clones)."""

from __future__ import annotations

import json
import socket

from tests.cli.test_shared_target import SETS, clones, job  # noqa: F401 (fixture)


def _bury(p, exp_id: int, count: int = 25) -> None:
    """``count`` later launches that never reached the target: ``exp_id`` is far outside any window of recent runs."""
    with p.registry() as reg:
        first = reg.get(exp_id)
        for _ in range(count):
            reg.create(project=first.project, target=first.target, machine=first.machine, revision=first.revision,
                       command=first.command, status="failed", error="never reached the target")


def test_a_command_that_reaches_the_target_settles_every_unsettled_row(clones):
    a, b = clones
    job(a, "A", 0, sleep=600)
    job(b, "B", 0, sleep=600)
    assert a.run("deploy", *SETS).returncode == 0
    _bury(a, 1)
    assert b.run("deploy", *SETS).returncode == 0  # stops A's run 1 behind A's back
    assert a.registry().get(1).status == "running"
    res = a.run("checkpoints", "list")
    assert res.returncode == 0, res.stderr
    exp = a.registry().get(1)
    host = socket.gethostname()
    assert exp.status == "stopped"
    assert exp.end_reason == f"stopped by experiment 1 of another clone of this project ({host}, {b.path})"
    assert exp.ended == json.loads((a.run_dir(1) / "exit.json").read_text())["ended"]  # the real end time
    # A's stop stops the project's run, which is B's; B learns who stopped it from its next contact (logs)
    assert a.run("stop").returncode == 0
    _bury(b, 1)
    res = b.run("logs", "-n", "1")
    assert res.returncode == 0, res.stderr
    exp = b.registry().get(1)
    assert exp.status == "stopped"
    assert exp.end_reason == f"stopped by orch stop from another clone ({host}, {a.path})"


def test_a_deploy_records_whom_its_stop_ended(clones):
    a, _ = clones
    job(a, "A", 0, sleep=600)
    assert a.run("deploy", *SETS).returncode == 0
    assert a.run("deploy", *SETS).returncode == 0
    assert a.registry().get(1).end_reason == "stopped by experiment 2"
    assert a.run("stop").returncode == 0
    assert a.registry().get(2).end_reason == "stopped by orch stop"
    shown = a.run("status")
    assert "experiment 2 stopped" in shown.stdout and "stopped by orch stop" in shown.stdout, shown.stdout
