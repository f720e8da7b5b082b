"""A graceful stop gives the run its whole grace period of its own time: time it spends stopped (SIGSTOP, a
frozen cgroup) does not count (real tmux, the real CLI in a subprocess)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from tests.conftest import wait_for
from tests.integration.test_frozen_ct import GRACEFUL

SETS = ["--set", "project.sources=['job.py']", "--set", "project.command=python3 job.py"]


def test_time_the_run_spends_stopped_does_not_count_against_stop_timeout(project):
    (project.path / "job.py").write_text(GRACEFUL)
    assert project.run("deploy", *SETS).returncode == 0
    log = project.run_dir(1) / "train.log"
    wait_for(lambda: log.exists() and "step=3" in log.read_text(), what="the run's first steps")
    child = json.loads((project.run_dir(1) / "pid.json").read_text())["child"]
    env = dict(os.environ, ORCH_RUN__STOP_TIMEOUT="2")
    stop = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "stop"], cwd=project.path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: "got SIGINT" in log.read_text(), what="the SIGINT")
    os.kill(child, signal.SIGSTOP)  # held for longer than the grace period, mid-way through its final checkpoint
    time.sleep(4)
    os.kill(child, signal.SIGCONT)
    out, err = stop.communicate(timeout=60)
    assert stop.returncode == 0, err
    assert "signals: SIGINT)" in out, out
    assert (project.checkpoints / "final.pt").read_text() == "done"
    assert "final checkpoint written" in log.read_text()
