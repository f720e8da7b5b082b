"""A searching sweep on a real LXC container: twelve trials over a range, conducted by a detached process on the
controller, pruned from the logs the CT prints; the conductor killed and the CT stopped and started again in the
middle, and ``orch sweep resume`` goes on with every trial, none run twice."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.cli.test_sweep_search import SCRIPT
from tests.integration.test_remote import remote  # noqa: F401 (fixture)
from tests.conftest import end_conductors
from tests.waits import wait_for

pytestmark = pytest.mark.testbed
pytest.importorskip("optuna")


def _show(remote, sweep: str) -> dict:
    shown = remote.run("sweep", "show", sweep, "--json")
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)


def test_a_search_on_a_ct_goes_on_after_its_conductor_and_the_ct_went_down(remote, testbed):
    remote.write()
    (remote.path / "train.py").write_text(SCRIPT)
    started = remote.run("sweep", "--ct", "200", "--set", "project.env.LR=loguniform(1e-5,1.0)",
                         "--set", "project.env.PAUSE=0.1", "--set", "run.resume_after_reboot=true",
                         "--trials", "12", "--steps", "20", "--min-steps", "2", "--seed", "1", "--json")
    assert started.returncode == 0, started.stderr
    sweep, pid = json.loads(started.stdout)["sweep"], json.loads(started.stdout)["conductor"]
    try:
        wait_for(lambda: _show(remote, sweep)["trials_asked"] >= 4, timeout=240, what="the fourth trial", every=1)
        os.kill(pid, signal.SIGKILL)
        testbed.stop(200)  # the trial in flight goes down with the CT
        testbed.start(200)
        time.sleep(3)
        resumed = remote.run("sweep", "resume", sweep, "--json")
        assert resumed.returncode == 0, resumed.stderr

        def ended():
            table = _show(remote, sweep)
            return table["conductor"] is None and table["trials_asked"] == 12 and \
                all(r["state"] in ("complete", "pruned", "failed") for r in table["rows"]) and table
        table = wait_for(ended, timeout=600, what="the sweep's end", every=2)
    finally:
        end_conductors((remote.path / ".orch" / "sweeps").glob("*.lock"), b"conduct")
    rows = table["rows"]
    assert sorted(r["trial"] for r in rows) == list(range(12))
    with remote.registry() as reg:
        exps = reg.list(sweep=sweep)
    ran = [e for e in exps if e.started is not None]  # a launch the kill cut short never started, and is redone
    assert len(ran) == 12 and sorted(r["experiment"] for r in rows) == sorted(e.id for e in ran)  # none twice
    assert all(e.target == "ct200" for e in ran)
    assert sum(r["state"] == "pruned" for r in rows) >= 2, rows
    assert sum(r["state"] == "complete" for r in rows) >= 3, rows
    failed = [r for r in rows if r["state"] == "failed"]
    assert len(failed) <= 1, failed  # at most the trial the CT went down under, if it could not come back
    assert 10 ** -3.6 <= float(rows[0]["params"]["project.env.LR"]) <= 10 ** -2.4, rows[0]


def test_a_pruned_trial_on_a_ct_resumes_there_from_its_checkpoint(remote, testbed):
    remote.write()
    (remote.path / "train.py").write_text(SCRIPT)
    started = remote.run("sweep", "--ct", "200", "--set", "project.env.LR=1e-3,0.1,1.0", "--set",
                         "project.env.PAUSE=0.1", "--sampler", "grid", "--prune", "asha", "--steps", "30",
                         "--min-steps", "3", "--seed", "3", "--json")
    assert started.returncode == 0, started.stderr
    sweep = json.loads(started.stdout)["sweep"]

    def ended():
        table = _show(remote, sweep)
        return table["conductor"] is None and all(r["state"] in ("complete", "pruned") for r in table["rows"]) \
            and len(table["rows"]) == 3 and table
    table = wait_for(ended, timeout=300, what="the sweep's end", every=2)
    pruned = next(r for r in table["rows"] if r["state"] == "pruned")
    resumed = remote.run("sweep", "resume", sweep, "--trial", str(pruned["trial"]), "--json")
    assert resumed.returncode == 0, resumed.stderr
    new = json.loads(resumed.stdout)

    def finished():
        shown = remote.run("status", "-e", str(new["experiment"]), "--json")
        return shown.returncode == 0 and json.loads(shown.stdout).get("state") == "finished"
    wait_for(finished, timeout=180, what="the resumed trial's end", every=2)
    log = remote.run("logs", "-e", str(new["experiment"]), "-n", "100").stdout
    with remote.registry() as reg:
        old, exp = reg.get(pruned["experiment"]), reg.get(new["experiment"])
    assert exp.target == "ct200" and exp.parent == old.id and exp.checkpoints == old.checkpoints, exp
    assert f"resumed from {old.checkpoints}/step" in log and "step=30 " in log and "step=1 " not in log, log
