"""``orch sweep`` on the local target: tinylm's batching strategies as one sweep, each variant ended at its step
budget by the target's supervisor (the script reads no budget), queued behind each other; ``sweep show`` ranks
them by throughput beside the planner's padding efficiency; ``sweep stop`` stops and dequeues (real tmux, the
real CLI in a subprocess)."""

from __future__ import annotations

import importlib.util
import json
import re
import time

from tests.conftest import EXAMPLE, wait_for



def _tinylm():
    spec = importlib.util.spec_from_file_location("tinylm_train", EXAMPLE / "train.py")
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    return train


def _with_lengths(project, steps: int = 100000, sleep: float = 0.0) -> None:
    """tinylm's own sample lengths as the planner's ``[batching] lengths`` (so each plan reports its efficiency)."""
    lengths, _, _ = _tinylm().make_data(600, 512)
    (project.path / "lengths.txt").write_text("\n".join(str(int(n)) for n in lengths) + "\n")
    project.configure(steps=steps, sleep=sleep, ckpt_every=1000)
    text = (project.path / "orch.toml").read_text().replace("[batching]\n", "[batching]\nlengths = \"lengths.txt\"\n")
    (project.path / "orch.toml").write_text(text)


def _last_step(log: str) -> int:
    return max(int(m) for m in re.findall(r"^step=(\d+) ", log, re.M))


def test_a_batching_sweep_ends_each_variant_at_its_budget_and_ranks_them(project):
    _with_lengths(project)
    done = project.run("sweep", "--set", "batching.strategy=sorted,shuffle,bucketed", "--steps", "60", "--json")
    assert done.returncode == 0, done.stderr
    launched = json.loads(done.stdout)
    sweep = launched["sweep"]
    assert [(v["id"], v["settings"], v["status"]) for v in launched["variants"]] == [
        (1, {"batching.strategy": "sorted"}, "running"), (2, {"batching.strategy": "shuffle"}, "queued"),
        (3, {"batching.strategy": "bucketed"}, "queued")]
    # no orch command from here: each variant ends at 60 steps and the next one starts
    wait_for(lambda: (project.run_dir(3) / "exit.json").exists(), timeout=120, what="the last variant's end")
    for exp_id in (1, 2, 3):
        run = project.run_dir(exp_id)
        log = (run / "train.log").read_text()
        assert 60 <= _last_step(log) < 100000, log[-500:]
        assert "[orch] budget reached (60 steps): SIGINT" in log
        assert json.loads((run / "budget.json").read_text())["spent"] == "60 steps"
        assert json.loads((run / "launch.json").read_text())["env"]["ORCH_MAX_STEPS"] == "60"
    shown = project.run("sweep", "show", sweep, "--json")
    assert shown.returncode == 0, shown.stderr
    table = json.loads(shown.stdout)
    variants = table["variants"]
    assert sorted(v["id"] for v in variants) == [1, 2, 3]
    assert "batching.strategy" in table["keys"]  # and what the planner chose for it (bucketed's buckets)
    rates = [v["throughput"] for v in variants]
    assert all(r > 0 for r in rates) and rates == sorted(rates, reverse=True)  # ranked by throughput
    assert [v["best"] for v in variants] == [True, False, False]
    assert table["window"][1] >= 60
    with project.registry() as reg:
        for v in variants:
            exp = reg.get(v["id"])
            assert (exp.status, exp.sweep) == ("finished", sweep)
            assert v["efficiency"] == exp.batching_plan["efficiency"] and 0 < v["efficiency"] <= 1
            assert v["status"] == "finished" and "budget of 60 steps" in (exp.end_reason or ""), exp.end_reason
            assert exp.checkpoints == f"{project.checkpoints}@exp{exp.id}"  # its own, beside the lineage's
    by_strategy = {v["settings"]["batching.strategy"]: v for v in variants}
    assert by_strategy["sorted"]["efficiency"] > by_strategy["shuffle"]["efficiency"]
    text = project.run("sweep", "show", sweep).stdout
    assert "best" in text and "shuffle" in text and "efficiency" in text, text
    listed = project.run("experiments", "list").stdout
    assert sweep in listed
    image = project.path / "sweep.png"
    drawn = project.run("experiments", "plot", "--sweep", sweep, "-o", str(image), "--metric", "throughput")
    assert drawn.returncode == 0, drawn.stderr
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_stop_stops_the_running_variant_and_dequeues_the_rest(project):
    _with_lengths(project, sleep=0.05)
    done = project.run("sweep", "--set", "batching.strategy=sorted,shuffle,bucketed", "--steps", "100000", "--json")
    assert done.returncode == 0, done.stderr
    sweep = json.loads(done.stdout)["sweep"]
    wait_for(lambda: "step=10 " in (project.run_dir(1) / "train.log").read_text(), what="the first variant's steps")
    stopped = project.run("sweep", "stop", sweep)
    assert stopped.returncode == 0, stopped.stderr
    assert f"sweep {sweep}: removed from the queue: experiment 2, experiment 3" in stopped.stdout, stopped.stdout
    assert "experiment 1" in stopped.stdout and "stopped" in stopped.stdout
    time.sleep(2)  # a queue left behind starts its next variant within a second
    assert not project.run_dir(2).exists() and not project.run_dir(3).exists()
    with project.registry() as reg:
        assert [reg.get(i).status for i in (1, 2, 3)] == ["stopped", "stopped", "stopped"]


def test_bad_sweep_input_is_refused_before_anything_is_launched(project):
    for args, message in ((["sweep", "--steps", "5"], "a sweep needs at least one --set"),
                          (["sweep", "--set", "batching.strategy=sorted,", "--steps", "5"], "has an empty value"),
                          (["sweep", "--set", "batching.strategy=sorted,shuffle"], "a sweep needs a budget"),
                          (["sweep", "--set", "batching.strategy=sorted,nope", "--steps", "5"], "batching"),
                          (["sweep", "show", "s000000"], "no sweep 's000000'"),
                          (["sweep", "stop", "s000000"], "no sweep 's000000'"),
                          (["experiments", "plot", "--sweep", "s000000", "-o", "x.png"], "no sweep 's000000'")):
        done = project.run(*args)
        assert done.returncode != 0, args
        assert "error: " in done.stderr and message in done.stderr and "hint: " in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr
    assert not (project.root / "runs").exists() or not any((project.root / "runs").iterdir())
    with project.registry() as reg:
        assert reg.list() == []


def test_a_run_ended_at_its_budget_is_finished_and_never_restarted(project):
    project.configure(steps=100000)
    env = '{OMP_NUM_THREADS = "1", TINYLM_STEPS = "100000", TINYLM_SAMPLES = "600", ORCH_MAX_STEPS = "30"}'
    done = project.run("deploy", "--set", "run.restarts=2", "--set", "run.backoff=[0.2]", "--set", f"project.env={env}")
    assert done.returncode == 0, done.stderr
    wait_for(lambda: (project.run_dir(1) / "exit.json").exists(), timeout=60, what="the run's end at its budget")
    time.sleep(1)  # a restart would begin within the backoff
    attempts = json.loads((project.run_dir(1) / "attempts.json").read_text())["attempts"]
    assert [a["reason"] for a in attempts] == ["budget"], attempts
    assert json.loads((project.run_dir(1) / "exit.json").read_text())["exit_code"] == 130  # tinylm's Ctrl-C exit
    status = json.loads(project.run("status", "--json").stdout)
    assert (status["state"], status["end_reason"]) == ("finished", "reached its budget of 30 steps"), status
