"""``orch sweep --on-target`` on a real LXC container: the conductor runs in the CT, in the environment orch
builds there with Optuna (its wheels pushed: the CT reaches no index), and no conductor ever runs on the
controller; the CT is stopped and started again in the middle of the sweep, its systemd unit starts the
conductor again, and the sweep ends with every trial, none run twice."""

from __future__ import annotations

import json
import time

import pytest

from tests.cli.test_env import download_wheels
from tests.cli.test_sweep_search import SCRIPT
from tests.integration.test_multinode_ct import _on_host
from tests.integration.test_remote import ROOT, remote  # noqa: F401 (fixture)
from tests.waits import wait_for

pytestmark = pytest.mark.testbed
pytest.importorskip("optuna")


@pytest.fixture(scope="module")
def wheels_folder(tmp_path_factory):
    return download_wheels(tmp_path_factory.mktemp("wheels"), ("optuna", "alembic", "colorlog", "mako", "markupsafe",
                                                                "numpy", "packaging", "pyyaml", "sqlalchemy", "tqdm",
                                                                "typing_extensions"))


@pytest.fixture(autouse=True)
def _offline(tmp_path, monkeypatch, wheels_folder):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels_folder))


def _show(remote, sweep: str) -> dict:  # noqa: F811
    shown = remote.run("sweep", "show", sweep, "--json", timeout=180)
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)


def test_a_search_conducted_in_the_ct_goes_on_through_a_reboot_with_no_trial_twice(remote, testbed):  # noqa: F811
    remote.write(extra='\n[env]\nrequirements = "requirements.txt"\n')
    (remote.path / "requirements.txt").write_text("optuna\n")
    (remote.path / "train.py").write_text(SCRIPT)
    started = remote.run("sweep", "--on-target", "--ct", "200", "--set", "project.env.LR=loguniform(1e-5,1.0)",
                         "--set", "project.env.PAUSE=0.1", "--trials", "12",
                         "--steps", "20", "--min-steps", "2", "--seed", "1", "--json", timeout=600)
    assert started.returncode == 0, started.stderr
    sweep = json.loads(started.stdout)["sweep"]
    assert json.loads(started.stdout)["on_target"].startswith("CT 200") and json.loads(started.stdout)["conductor"]
    wait_for(lambda: _show(remote, sweep)["trials_asked"] >= 4, timeout=240, what="the fourth trial", every=2)
    testbed.stop(200)  # the conductor and the trial in flight go down with the CT
    testbed.start(200)  # nothing from the controller, and no run resumes to end: only the sweep's unit starts it

    def ended():
        table = _show(remote, sweep)
        return table["trials_asked"] == 12 and table["conductor"] is None and \
            all(r["state"] in ("complete", "pruned", "failed") for r in table["rows"]) and table

    def logs() -> str:
        return _on_host(testbed, 200, f"{ROOT}/sweeps/tinylm/{sweep}/conductor.log").read_text()
    table = wait_for(ended, timeout=600, what="the sweep's end", every=3, describe=logs)
    print(logs())
    assert logs().count("conductor starts on the target") == 2, logs()
    assert not (remote.path / ".orch" / "sweeps" / f"{sweep}.log").exists()  # no conductor here, ever
    rows = table["rows"]
    assert sorted(r["trial"] for r in rows) == list(range(12))
    with remote.registry() as reg:
        exps = reg.list(sweep=sweep)
    assert sorted(e.id for e in exps) == sorted(r["experiment"] for r in rows)  # each trial once, recorded here
    assert all(e.target == "ct200" for e in exps)
    runs = [p for p in _on_host(testbed, 200, f"{ROOT}/runs").iterdir()]
    assert len(runs) == 12, runs  # no trial ran twice
    assert sum(r["state"] == "pruned" for r in rows) >= 2 and sum(r["state"] == "complete" for r in rows) >= 3, rows
    assert sum(r["state"] == "failed" for r in rows) <= 1, rows  # the one the CT went down under, lost
    assert 10 ** -3.6 <= float(rows[0]["params"]["project.env.LR"]) <= 10 ** -2.4, rows[0]


def test_a_ct_with_no_python_that_imports_optuna_refuses_the_sweep_before_any_trial_runs(remote, testbed):  # noqa: F811
    remote.write()
    (remote.path / "train.py").write_text(SCRIPT)
    done = remote.run("sweep", "--on-target", "--ct", "200", "--set", "project.env.LR=loguniform(1e-5,1.0)",
                      "--trials", "4", "--steps", "20", timeout=300)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "no Python on the target imports optuna" in done.stderr and "hint: add optuna to the project's [env]" \
        in done.stderr, done.stderr
    with remote.registry() as reg:
        (exp,) = reg.list()
    assert exp.status == "stopped" and exp.started is None, exp  # its first trial, taken out of the queue unstarted
    runs = _on_host(testbed, 200, f"{ROOT}/runs")
    assert not runs.exists() or not any(runs.iterdir())
