"""``orch sweep --on-target``: the search's conductor runs on its target (here the local one), kept alive there as
the target keeps its queue, so nobody needs to be at the controller; the controller reads the study back and
records the trials the target started (real Optuna, real tmux, the real CLI in a subprocess)."""

from __future__ import annotations

import json
import os
import signal

import pytest

from tests.cli.test_sweep_search import CONFIG, SCRIPT, _show
from tests.conftest import end_conductors
from tests.waits import wait_for

pytest.importorskip("optuna")


@pytest.fixture
def quad(project):
    (project.path / "train.py").write_text(SCRIPT)
    (project.path / "orch.toml").write_text(CONFIG.format(root=project.root, pause=0.05))
    yield project
    end_conductors((project.root / "sweeps").glob("*/*/.lock"), b"sweep-conduct")


def test_a_search_conducted_on_its_target_outlives_a_killed_conductor_with_no_trial_twice_or_lost(quad):
    # trials of 20 steps of 0.1 s (the pruned ones end at their second): the search lasts well past the kill below
    # however late a loaded machine's `sweep show` sees its second trial
    started = quad.run("sweep", "--on-target", "--set", "project.env.LR=loguniform(1e-5,1.0)", "--set",
                       "project.env.PAUSE=0.1", "--trials", "8", "--steps", "20", "--min-steps", "2", "--seed", "1",
                       "--json")
    assert started.returncode == 0, started.stderr
    sweep, pid = json.loads(started.stdout)["sweep"], json.loads(started.stdout)["conductor"]
    assert pid and b"sweep-conduct" in open(f"/proc/{pid}/cmdline", "rb").read()  # on the target, not orch's
    assert not (quad.path / ".orch" / "sweeps" / f"{sweep}.log").exists()  # the controller conducts nothing
    wait_for(lambda: _show(quad, sweep)["trials_asked"] >= 2, timeout=120, what="the second trial", every=1)
    assert _show(quad, sweep)["trials_asked"] < 8, "the search ended before its conductor could be killed mid-way"
    os.kill(pid, signal.SIGKILL)  # mid-trial; only `sweep show` runs from here on, which starts nothing

    def ended():
        table = _show(quad, sweep)
        return table["trials_asked"] == 8 and table["conductor"] is None and \
            all(r["state"] in ("complete", "pruned", "failed") for r in table["rows"]) and table
    logs = lambda: "\n".join(p.read_text() for p in (quad.root / "sweeps").glob(f"*/{sweep}/conductor.log"))
    table = wait_for(ended, timeout=240, what="the sweep's end", every=2,
                     describe=lambda: logs() + quad.run("sweep", "show", sweep).stdout)
    rows = table["rows"]
    assert table["on_target"] == "local" and sorted(r["trial"] for r in rows) == list(range(8))
    assert sum(r["state"] == "pruned" for r in rows) >= 1 and sum(r["state"] == "complete" for r in rows) >= 3, rows
    assert not any(r["state"] == "failed" for r in rows), rows
    assert 10 ** -4 <= float(rows[0]["params"]["project.env.LR"]) <= 10 ** -2, rows[0]
    log = next((quad.root / "sweeps").glob(f"*/{sweep}/conductor.log")).read_text()
    assert log.count("conductor starts on the target") == 2, log  # started again there, by nobody here
    with quad.registry() as reg:
        exps = reg.list(sweep=sweep)
    assert sorted(e.id for e in exps) == sorted(r["experiment"] for r in rows)  # each trial once, recorded here
    assert all(e.started is not None and e.status in ("finished", "stopped") for e in exps), exps
    runs = [p.name for p in (quad.root / "runs").iterdir()]
    assert len(runs) == 8, runs  # no trial ran twice
    pruned = next(r for r in rows if r["state"] == "pruned")
    folder = next(e.checkpoints for e in exps if e.id == pruned["experiment"])
    assert folder.endswith(f"exp{pruned['experiment']}") and os.listdir(folder), folder  # its checkpoint kept


def test_a_search_on_its_target_refuses_what_a_queue_entry_cannot_vary(quad):
    done = quad.run("sweep", "--on-target", "--set", "batching.token_budget=4096,8192", "--sampler", "grid",
                    "--steps", "20")
    assert done.returncode == 2 and "project.env" in done.stderr and "hint:" in done.stderr, done.stderr
    assert not (quad.path / ".orch" / "sweeps").exists() or not list((quad.path / ".orch" / "sweeps").glob("*.db"))


def test_a_search_on_its_target_stops_with_its_conductor_there_first(quad):
    started = quad.run("sweep", "--on-target", "--set", "project.env.LR=loguniform(1e-5,1.0)", "--set",
                       "project.env.PAUSE=0.2", "--trials", "20", "--steps", "200", "--prune", "none", "--json")
    assert started.returncode == 0, started.stderr
    sweep, pid = json.loads(started.stdout)["sweep"], json.loads(started.stdout)["conductor"]
    wait_for(lambda: any(r["state"] == "running" and r["experiment"] for r in _show(quad, sweep)["rows"]),
             timeout=60, what="the first trial", every=1)
    stopped = quad.run("sweep", "stop", sweep, "--json")
    assert stopped.returncode == 0, stopped.stderr
    assert json.loads(stopped.stdout)["conductor"] == pid and not os.path.exists(f"/proc/{pid}")
    assert [r["state"] for r in json.loads(stopped.stdout)["stopped"]] == ["stopped"]
    table = _show(quad, sweep)
    assert table["conductor"] is None and table["trials_asked"] == 1, table
    assert [r["state"] for r in table["rows"]] == ["failed"], table["rows"]  # told so here, kept so
    resumed = quad.run("sweep", "resume", sweep, "--json")  # a stopped sweep's conductor does not start again
    assert resumed.returncode == 0 and json.loads(resumed.stdout)["conductor"] is None, resumed.stdout


def test_a_metric_the_log_never_prints_ends_a_search_on_its_target_with_a_reason(quad):
    started = quad.run("sweep", "--on-target", "--set", "project.env.LR=loguniform(1e-5,1.0)", "--trials", "6",
                       "--steps", "40", "--min-steps", "3", "--metric", "val_acc", "--parallel", "2", "--json")
    assert started.returncode == 0, started.stderr
    sweep = json.loads(started.stdout)["sweep"]

    def ended():
        table = _show(quad, sweep)
        return table["conductor"] is None and table["error"] and table
    table = wait_for(ended, timeout=120, what="the sweep's end", every=1)
    assert "printed no 'val_acc'" in table["error"] and "loss" in table["error"], table["error"]
    assert table["trials_asked"] == 2 and all(r["state"] == "failed" for r in table["rows"]), table["rows"]
    assert "the sweep ended: the log printed no 'val_acc'" in quad.run("sweep", "show", sweep).stdout
    with quad.registry() as reg:
        exps = reg.list(sweep=sweep)
    assert [e.status for e in exps if e.started] == ["stopped"], exps  # the one that ran, stopped at once
    assert [e.status for e in exps if not e.started] == ["stopped"], exps  # the other, taken out of the queue


def test_orch_status_records_the_trials_a_search_on_its_target_started(quad):
    started = quad.run("sweep", "--on-target", "--set", "project.env.LR=loguniform(1e-5,1.0)", "--trials", "3",
                       "--steps", "10", "--prune", "none", "--json")
    assert started.returncode == 0, started.stderr
    sweep = json.loads(started.stdout)["sweep"]
    spec = quad.root / "sweeps" / "quad" / sweep / "spec.json"
    wait_for(lambda: json.loads(spec.read_text()).get("ended"), timeout=120, what="the sweep's end", every=1)
    with quad.registry() as reg:
        assert [e.id for e in reg.list(sweep=sweep)] == [1]  # the first trial only: nobody has looked since
    shown = quad.run("status", "-e", "3", "--json")  # no sweep show: status alone records them
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["state"] == "finished", shown.stdout
    with quad.registry() as reg:
        exps = sorted(reg.list(sweep=sweep), key=lambda e: e.id)
    assert [(e.id, e.status) for e in exps] == [(1, "finished"), (2, "finished"), (3, "finished")], exps
    assert exps[2].message.startswith(f"sweep {sweep}: trial 2: project.env.LR=")
    assert not list((quad.path / ".orch" / "sweeps").glob("*.target"))  # ended: status asks no more
