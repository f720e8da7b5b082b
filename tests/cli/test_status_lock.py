"""`orch status` records what its target said in short write transactions, never around an agent call: a status
waiting on a slow target holds up no other command on the registry (another status, the dashboard's actions)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import wait_for

# the target's python, each call of the agent it runs slowed down (a slow target); every call is counted
SLOW_PYTHON = '#!/bin/sh\necho call >> "{calls}"\nsleep {delay}\nexec "{python}" "$@"\n'
DELAY_S = 6


def test_a_status_waiting_on_its_target_holds_up_no_other_status(project, tmp_path: Path):
    project.configure(steps=3)
    assert project.run("deploy", "--wait").returncode == 0  # ended; its metrics read first by the status below
    with project.registry() as reg:
        assert reg.metrics(1) is None
    project.configure(steps=100000, sleep=0.1)
    assert project.run("deploy").returncode == 0
    calls, slow = tmp_path / "calls", tmp_path / "slow-python"
    slow.write_text(SLOW_PYTHON.format(calls=calls, delay=DELAY_S, python=sys.executable))
    slow.chmod(0o755)
    held = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "status"], cwd=project.path,
                            env=dict(os.environ, ORCH_TARGETS__LOCAL__PYTHON=str(slow)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        # its first call answered (the rows and the log); the second reads experiment 1's log, to compare with
        wait_for(lambda: calls.exists() and len(calls.read_text().split()) >= 2, timeout=60,
                 what="the slow status's second agent call")
        begin = time.monotonic()
        other = project.run("status")
        took = time.monotonic() - begin
        out, err = held.communicate(timeout=120)
    finally:
        if held.poll() is None:
            held.kill()
            held.wait()
    assert other.returncode == 0, other.stdout + other.stderr
    assert "locked" not in other.stderr and "experiment 2 running" in other.stdout
    assert took < DELAY_S, f"the second status waited {took:.1f} s on the first"  # not a timing bar: a lock wait
    assert held.returncode == 0, out + err
    assert "locked" not in err and "experiment 2 running" in out
    assert len(calls.read_text().split()) == 2  # the slow status's own calls: its rows and log, then experiment 1
    with project.registry() as reg:
        assert reg.metrics(1)["summary"]["_state"]["complete"] and reg.metrics(2)["summary"]["step"] is not None
