"""The supervisor's budget reader: steps counted from the run's log as it grows, orch's own lines ignored."""

from __future__ import annotations

from orchestrator.agent.watch.budget import Budget


def test_steps_are_read_as_the_log_grows_and_the_budget_is_spent_at_its_step(tmp_path):
    log = tmp_path / "train.log"
    budget = Budget.from_env({"ORCH_MAX_STEPS": "20"}, str(tmp_path))
    assert budget is not None and budget.check() is None  # no log yet
    log.write_text("orch: experiment run in /x\ntotal_steps=3000\n[orch] step=99 from another attempt\nstep=10 loss=2")
    assert budget.check() is None and budget.step == 0  # the partial line waits for its end
    with log.open("a") as fh:
        fh.write(".1\niter 15: loss 2.0\n")
    assert budget.check() is None and budget.step == 15
    with log.open("a") as fh:
        fh.write("step: 20  loss: 1.9\n")
    assert budget.check() == "20 steps"


def test_minutes_and_no_budget(tmp_path):
    assert Budget.from_env({"ORCH_MAX_STEPS": "", "ORCH_MAX_MINUTES": "0"}, str(tmp_path)) is None
    timed = Budget.from_env({"ORCH_MAX_MINUTES": "0.5"}, str(tmp_path))
    assert timed is not None
    assert timed.check(now=timed.started + 29) is None
    assert timed.check(now=timed.started + 30) == "0.5 minutes"
