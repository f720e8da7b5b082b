"""``orch sweep --trials N``: a search over ranges, conducted by a detached process with real Optuna, pruning from
the log as printed (real tmux, the real CLI in a subprocess). The script's loss has a known optimum: its floor is
``(log10(LR) + 3)^2``, lowest at LR = 1e-3, and it falls with the tokens seen, the same for any batch size."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import end_conductors
from tests.waits import wait_for

pytest.importorskip("optuna")

SCRIPT = """\
import json, math, os, signal, time
lr = float(os.environ.get("LR", "0.01"))
batching = json.load(open(os.environ["ORCH_BATCHING_FILE"])) if os.environ.get("ORCH_BATCHING_FILE") else {}
per_step = int(batching.get("token_budget") or 4096)
ckpt = os.environ.get("ORCH_CHECKPOINT_DIR") or "ckpt"
stop = []
signal.signal(signal.SIGINT, lambda *a: stop.append(1))
floor = (math.log10(lr) + 3) ** 2
resume = os.environ.get("ORCH_RESUME_FROM")
step = int(open(resume).read()) if resume else 0  # a resumed trial goes on from its checkpoint's step
if resume:
    print(f"resumed from {resume}", flush=True)
while not stop:
    step += 1
    tokens = step * per_step
    print(f"step={step} loss={floor + 2.0 / (1 + tokens / 20480):.6f}", flush=True)
    time.sleep(float(os.environ.get("PAUSE", "0.1")))
os.makedirs(ckpt, exist_ok=True)
with open(os.path.join(ckpt, f"step{step}.ckpt"), "w") as fh:
    fh.write(str(step))
print(f"saved step{step}.ckpt", flush=True)
"""

CONFIG = """\
default_target = "local"

[project]
name = "quad"
sources = ["train.py"]
command = "python3 train.py"
env = {{ PAUSE = "{pause}" }}

[batching]
token_budget = 4096
max_seq_len = 512

[run]
stop_timeout = 5
term_timeout = 3

[targets.local]
kind = "local"
root = "{root}"
checkpoints = "{root}/checkpoints"
"""


@pytest.fixture
def quad(project):
    (project.path / "train.py").write_text(SCRIPT)
    (project.path / "orch.toml").write_text(CONFIG.format(root=project.root, pause=0.1))
    yield project
    end_conductors((project.path / ".orch" / "sweeps").glob("*.lock"), b"conduct")  # a failed test's


def _show(project, sweep: str) -> dict:
    shown = project.run("sweep", "show", sweep, "--json")
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)


def _ended(project, sweep: str, timeout: float = 240) -> dict:
    def done():
        table = _show(project, sweep)
        return table["conductor"] is None and (table["trials_asked"] == table["trials"] or table["error"]) and \
            all(r["state"] in ("complete", "pruned", "failed") for r in table["rows"])
    wait_for(done, timeout=timeout, what="the sweep's end", every=1.0)  # each look is an orch command
    return _show(project, sweep)


def _start(project, *args: str) -> dict:
    done = project.run("sweep", *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_search_prunes_losers_at_their_rungs_keeps_their_checkpoints_and_finds_the_optimum(quad):
    started = _start(quad, "--set", "project.env.LR=loguniform(1e-5,1.0)", "--trials", "12", "--steps", "30",
                     "--min-steps", "3", "--seed", "1")
    sweep = started["sweep"]
    assert started["conductor"] and started["sampler"] == "tpe" and started["prune"] == "median"
    table = _ended(quad, sweep)  # nothing from here on: the detached conductor runs the sweep to its end
    rows = table["rows"]
    assert len(rows) == 12 and table["metric"] == "loss", table
    pruned = [r for r in rows if r["state"] == "pruned"]
    complete = [r for r in rows if r["state"] == "complete"]
    assert len(pruned) >= 3 and len(complete) >= 3, rows
    best = rows[0]
    assert best["best"] and best["state"] == "complete"
    assert 10 ** -3.6 <= float(best["params"]["project.env.LR"]) <= 10 ** -2.4, best  # the optimum's neighbourhood
    assert table["steps_run"] <= 0.75 * 12 * 30, table  # a grid of 12 would run every trial its 30 steps
    with quad.registry() as reg:
        exps = reg.list(sweep=sweep)
        assert sorted(e.id for e in exps) == sorted(r["experiment"] for r in rows)
        for r in pruned:
            # pruned at a rung, below the threshold it missed, and stopped as orch stop stops: checkpoint kept
            assert r["rung"] >= 1 and r["rung_at"] == 3 * r["rung"] and r["objective"] > r["threshold"], r
            exp = reg.get(r["experiment"])
            assert exp.status == "stopped", exp
            assert r["steps"] < 30
            saved = os.listdir(exp.checkpoints)
            assert saved and saved[0].endswith(".ckpt"), (exp.checkpoints, saved)
        for r in complete:
            assert reg.get(r["experiment"]).status == "finished" and r["steps"] >= 30
    text = quad.run("sweep", "show", sweep).stdout
    assert "pruned" in text and "best" in text and "pruning saved" in text, text
    image = quad.path / "search.png"
    drawn = quad.run("sweep", "plot", sweep, "-o", str(image))
    assert drawn.returncode == 0, drawn.stderr
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_conductor_killed_mid_sweep_resumes_with_no_trial_run_twice_or_lost(quad):
    started = _start(quad, "--set", "project.env.LR=loguniform(1e-5,1.0)", "--set", "project.env.X=a,b",
                     "--trials", "6", "--steps", "20", "--prune", "none", "--seed", "2")
    sweep, pid = started["sweep"], started["conductor"]
    wait_for(lambda: _show(quad, sweep)["trials_asked"] >= 3, timeout=120, what="the third trial", every=0.5)
    os.kill(pid, signal.SIGKILL)  # mid-trial: its run goes on, on the target, without a conductor
    wait_for(lambda: _show(quad, sweep)["conductor"] is None, what="the conductor's end", every=0.5)
    time.sleep(4)  # the trial in flight ends while nobody conducts
    table = _show(quad, sweep)
    asked = table["trials_asked"]
    assert asked < 6 and any(r["state"] == "running" for r in table["rows"])  # nobody told it yet
    assert "orch sweep resume" in quad.run("sweep", "show", sweep).stdout
    # two resumes at once (a second resume typed while the first conducts): one conductor starts, and both name it;
    # run one after the other, the first's conductor could end the last trials before the second asked
    argv = [sys.executable, "-m", "orchestrator.cli.main", "sweep", "resume", sweep, "--json"]
    both = [subprocess.Popen(argv, cwd=quad.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    answers = []
    for proc in both:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        answers.append(json.loads(out))
    assert sorted(a["started"] for a in answers) == [False, True], answers
    assert answers[0]["conductor"] == answers[1]["conductor"] is not None, answers
    table = _ended(quad, sweep)
    assert sorted(r["trial"] for r in table["rows"]) == list(range(6))
    assert all(r["state"] == "complete" for r in table["rows"]), table["rows"]
    with quad.registry() as reg:
        exps = reg.list(sweep=sweep)
    ran = [e for e in exps if e.started is not None]  # a launch the kill cut short never started, and is redone
    assert len(ran) == 6 and sorted(r["experiment"] for r in table["rows"]) == sorted(e.id for e in ran)
    assert all(e.status == "finished" for e in ran)


def test_two_batch_sizes_meet_at_the_same_tokens(quad):
    started = _start(quad, "--set", "batching.token_budget=4096,8192", "--sampler", "grid", "--rung-by", "tokens",
                     "--prune", "none", "--steps", "20", "--min-steps", "4")
    table = _ended(quad, started["sweep"])
    rows = {int(r["params"]["batching.token_budget"]): r for r in table["rows"]}
    assert set(rows) == {4096, 8192} and all(r["state"] == "complete" for r in rows.values())
    # the same data for both: the bigger batch runs half the steps, and both end at 20 * 4096 tokens
    assert (rows[4096]["budget_steps"], rows[8192]["budget_steps"]) == (20, 10)
    assert rows[4096]["tokens"] >= 20 * 4096 and rows[8192]["tokens"] >= 20 * 4096
    from orchestrator.launch.study import Study

    study = Study.read(quad.path / ".orch" / "sweeps" / f"{started['sweep']}.db", started["sweep"])
    curves = {int(t["params"]["batching.token_budget"]): t["intermediate"] for t in study.trials()}
    assert set(curves[4096]) == set(curves[8192]) == {4 * 4096 * k for k in range(1, 6)}  # rungs in tokens
    for at in curves[4096]:  # the loss depends on the tokens seen alone: equal at equal tokens
        assert curves[4096][at] == pytest.approx(curves[8192][at], abs=1e-6), (at, curves)


def test_a_metric_the_log_never_prints_ends_the_sweep_with_a_reason(quad):
    started = _start(quad, "--set", "project.env.LR=uniform(0.001,0.1)", "--trials", "4", "--steps", "30",
                     "--metric", "val_acc", "--mode", "max", "--min-steps", "3")
    table = _ended(quad, started["sweep"], timeout=90)
    assert "no 'val_acc'" in table["error"] and "it prints: loss" in table["error"], table
    assert table["trials_asked"] == 1 and table["rows"][0]["state"] == "failed"
    assert "the sweep ended" in quad.run("sweep", "show", started["sweep"]).stdout
    with quad.registry() as reg:
        assert [e.status for e in reg.list(sweep=started["sweep"])] == ["stopped"]  # stopped at once, not run out


BAD = [
    (["--set", "project.env.LR=loguniform(1.0,1e-5)", "--trials", "4"], "reversed", "loguniform(1e-5,1.0)"),
    (["--set", "project.env.LR=loguniform(0,1)", "--trials", "4"], "above 0", "uniform(0,1)"),
    (["--set", "project.env.LR=logint(0,8)", "--trials", "4"], "above 0", "int(0,8)"),
    (["--set", "project.env.LR=beta(1,2)", "--trials", "4"], "unknown distribution 'beta'", "loguniform"),
    (["--set", "project.env.LR=loguniform(1e-5,1.0)"], "needs --trials N", "--trials 12"),
    (["--set", "project.env.LR=1,2,3", "--trials", "4"], "only lists of values", "--sampler random"),
    (["--set", "project.env.LR=int(1.5,4)", "--trials", "4"], "whole numbers", "int(1,8)"),
    (["--set", "project.env.LR=uniform(1,x)", "--trials", "4"], "'x' is not a number", "loguniform"),
    (["--set", "project.env.LR=1,uniform(1,2)", "--trials", "4"], "mixes a distribution", "a,b,c"),
    (["--set", "project.env.LR=uniform(0,1)", "--trials", "4", "--sampler", "grid"], "cannot sample", "tpe"),
    (["--set", "project.env.LR=uniform(0,1)", "--trials", "4", "--sampler", "bayes"], "not one of", "tpe"),
    (["--set", "project.env.LR=uniform(0,1)", "--trials", "4", "--prune", "hard"], "not one of", "median"),
    (["--set", "project.env.LR=uniform(0,1)", "--trials", "4", "--rung-by", "epochs"], "not one of", "steps"),
    (["--set", "project.env.LR=uniform(0,1)", "--trials", "4", "--minutes", "2"], "not --minutes", "--steps"),
    (["--set", "project.env.LR=uniform(0,1)", "--trials", "4", "--steps", "10", "--min-steps", "10"],
     "leaves no step", "--min-steps 1"),
    (["--set", "project.env.LR=uniform(0,1)", "--trials", "4", "--steps", "60", "--min-steps", "60"],
     "leaves no step", "--min-steps 5"),  # the default: a twelfth of the budget
    (["--set", "batching.token_budget=int(100,9000)", "--trials", "4"], "token_budget", "fix the value"),
]


@pytest.mark.parametrize("args,message,hint", BAD, ids=[b[1] for b in BAD])
def test_bad_search_input_is_refused_before_any_trial_starts(quad, args, message, hint):
    steps = [] if "--steps" in args or "--minutes" in args else ["--steps", "10"]
    done = quad.run("sweep", *args, *steps)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "error: " in done.stderr and message in done.stderr, done.stderr
    assert "hint: " in done.stderr and hint in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not (quad.path / ".orch" / "sweeps").exists()
    assert not (quad.root / "runs").exists() or not any((quad.root / "runs").iterdir())


def test_parallel_trials_run_side_by_side_each_on_its_gpus(quad):
    text = (quad.path / "orch.toml").read_text().replace('kind = "local"\n', 'kind = "local"\ngpus = 2\n')
    (quad.path / "orch.toml").write_text(text)
    started = _start(quad, "--set", "project.env.LR=loguniform(1e-5,1.0)", "--trials", "4", "--steps", "20",
                     "--prune", "none", "--parallel", "2", "--gpus", "1", "--seed", "4")
    table = _ended(quad, started["sweep"])
    assert all(r["state"] == "complete" for r in table["rows"]), table["rows"]
    with quad.registry() as reg:
        exps = sorted(reg.list(sweep=started["sweep"]), key=lambda e: e.id)
    first, second = exps[0], exps[1]
    assert second.started < first.ended, (first, second)  # side by side, not one after the other
    given = [json.loads((quad.run_dir(e.id) / "launch.json").read_text())["env"]["CUDA_VISIBLE_DEVICES"]
             for e in (first, second)]
    assert sorted(given) == ["0", "1"], given
    shown = quad.run("sweep", "show", started["sweep"]).stdout
    assert "no trial was pruned: steps run" in shown and "pruning saved" not in shown, shown


def test_sweep_stop_ends_the_conductor_first_then_its_trials(quad):
    started = _start(quad, "--set", "project.env.LR=loguniform(1e-5,1.0)", "--trials", "6", "--steps", "100000",
                     "--prune", "none")
    sweep = started["sweep"]
    wait_for(lambda: "step=5 " in (quad.run_dir(1) / "train.log").read_text(), what="the first trial's steps")
    stopped = quad.run("sweep", "stop", sweep)
    assert stopped.returncode == 0, stopped.stderr
    assert f"its conductor (process {started['conductor']}) ended" in stopped.stdout, stopped.stdout
    assert "experiment 1" in stopped.stdout and "stopped" in stopped.stdout, stopped.stdout
    time.sleep(2)  # a conductor left behind would ask the next trial within a second
    table = _show(quad, sweep)
    assert table["conductor"] is None and table["trials_asked"] == 1, table
    assert table["rows"][0]["state"] == "failed" and table["rows"][0]["error"] == "stopped by orch sweep stop"
    with quad.registry() as reg:
        assert [e.status for e in reg.list(sweep=sweep)] == ["stopped"]


def test_a_conductor_killed_inside_a_launch_launches_that_trial_again_once(quad):
    import sqlite3

    started = _start(quad, "--set", "project.env.LR=loguniform(1e-5,1.0)", "--trials", "3", "--steps", "10",
                     "--prune", "none", "--seed", "5")
    sweep = started["sweep"]
    path = quad.path / ".orch" / "experiments.db"

    def launching():  # the second trial's row, written before its run is started on the target
        try:
            db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            try:
                rows = db.execute("SELECT id, status FROM experiments WHERE sweep = ?", (sweep,)).fetchall()
            finally:
                db.close()
        except sqlite3.OperationalError:  # not created yet, or being written
            return False
        return len(rows) >= 2 and any(s == "launching" for _, s in rows)
    wait_for(launching, timeout=60, what="a launch under way", every=0.01)
    os.kill(started["conductor"], signal.SIGKILL)
    assert quad.run("sweep", "resume", sweep).returncode == 0
    table = _ended(quad, sweep)
    assert [r["state"] for r in table["rows"]] == ["complete"] * 3
    with quad.registry() as reg:
        exps = reg.list(sweep=sweep)
    cut = [e for e in exps if e.started is None]
    assert len(cut) == 1 and cut[0].status == "failed", [(e.id, e.status) for e in exps]  # recorded, never run
    assert sorted(r["experiment"] for r in table["rows"]) == sorted(e.id for e in exps if e.started is not None)
    assert "was never started" in (quad.path / ".orch" / "sweeps" / f"{sweep}.log").read_text()


def test_a_pruned_trial_resumes_to_its_full_budget_from_its_checkpoint(quad):
    started = _start(quad, "--set", "project.env.LR=1e-3,0.1,1.0", "--sampler", "grid", "--prune", "asha",
                     "--steps", "30", "--min-steps", "3", "--seed", "3")
    sweep = started["sweep"]
    table = _ended(quad, sweep)
    pruned = next(r for r in table["rows"] if r["state"] == "pruned")
    done = next(r for r in table["rows"] if r["state"] == "complete")
    said = (quad.path / ".orch" / "sweeps" / f"{sweep}.log").read_text()
    assert "conductor ends: every trial has ended" in said and "Traceback" not in said, said  # the grid told
    with quad.registry() as reg:
        before = len(reg.list())
    for args, message in (([sweep, "--trial", str(done["trial"])], "not pruned or stopped"),
                          (["s0000000", "--trial", "0"], "no search 's0000000'"),
                          ([sweep, "--trial", "7"], "has no trial 7")):
        refused = quad.run("sweep", "resume", *args)
        assert refused.returncode == 2 and message in refused.stderr and "hint: " in refused.stderr, refused.stderr
    with quad.registry() as reg:
        assert len(reg.list()) == before  # nothing launched
        old = reg.get(pruned["experiment"])
    kept = sorted(os.listdir(old.checkpoints))  # the checkpoint its graceful stop wrote
    assert len(kept) == 1, kept
    resumed = quad.run("sweep", "resume", sweep, "--trial", str(pruned["trial"]), "--json")
    assert resumed.returncode == 0, resumed.stderr
    new = json.loads(resumed.stdout)
    assert new["from"] == pruned["experiment"] and new["budget_steps"] == 30

    def finished():  # orch status brings the registry up to date with the target
        shown = quad.run("status", "-e", str(new["experiment"]), "--json")
        return shown.returncode == 0 and json.loads(shown.stdout).get("state") in ("finished", "failed", "crashed")
    wait_for(finished, timeout=120, what="the resumed trial's end", every=1.0)
    with quad.registry() as reg:
        exp = reg.get(new["experiment"])
    assert exp.status == "finished" and exp.parent == old.id and exp.sweep == sweep, exp
    log = (quad.run_dir(exp.id) / "train.log").read_text()
    assert f"resumed from {old.checkpoints}/{kept[0]}" in log, log  # ORCH_RESUME_FROM: the pruned run's checkpoint
    first = int(kept[0].removeprefix("step").removesuffix(".ckpt"))
    assert f"step={first + 1} " in log and "step=1 " not in log and "step=30 " in log, log  # on to its budget
    again = _show(quad, sweep)
    row = next(r for r in again["rows"] if r["trial"] == pruned["trial"])
    assert row["resumed"] == exp.id and f"resumed: exp {exp.id}" in quad.run("sweep", "show", sweep).stdout
    twice = quad.run("sweep", "resume", sweep, "--trial", str(pruned["trial"]))
    assert twice.returncode == 2 and "resumed already" in twice.stderr, twice.stderr
