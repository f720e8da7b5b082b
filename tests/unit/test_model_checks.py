"""The model-based test's invariants catch what they claim to (pure functions over made-up probes)."""

from __future__ import annotations

from tests.testbed import model_checks as checks

REG = "0123456789ab"
MAIN, OWN = "/w/checkpoints", "/w/checkpoints/exp2"


def run(exp: int, folder: str, *starts: dict, **env) -> tuple[str, dict]:
    return f"{REG}-{exp}", {"env": {"ORCH_EXPERIMENT_ID": str(exp), "ORCH_CHECKPOINT_DIR": folder, **env},
                            "starts": list(starts)}


def start(exp: int, writer: int | None = None, **env) -> dict:
    return {"exp": str(exp), "resumed": f"/x/ckpt-{writer}.pt" if writer else "",
            "writer": str(writer) if writer else None,
            "env": {"ORCH_EXPERIMENT_ID": str(exp), **env}}


def test_a_resume_from_another_lineage_is_named_and_from_its_own_is_not():
    runs = dict([run(1, MAIN, start(1, ORCH_CHECKPOINT_DIR=MAIN)),
                 run(2, OWN, start(2, ORCH_CHECKPOINT_DIR=OWN)),
                 run(3, MAIN, start(3, 1, ORCH_CHECKPOINT_DIR=MAIN)),  # the main line's: fine
                 run(4, MAIN, start(4, 2, ORCH_CHECKPOINT_DIR=MAIN)),  # the --beside run's: not its lineage
                 run(5, "/w/checkpoints@exp5", start(5, 3))])  # a restart of 3 (its parent): fine
    runs.update([run(6, MAIN, {"exp": "6", "resumed": OWN, "writer": None, "env": {}})])  # told to resume from
    problems = checks.lineage(runs, {1: None, 2: None, 3: None, 4: None, 5: 3, 6: None})  # the --beside folder
    assert len(problems) == 2
    assert "experiment 6 (checkpoints /w/checkpoints) resumed from /w/checkpoints/exp2, in the checkpoint folder of " \
        "experiment 2" in problems[1]
    assert problems[0].startswith("experiment 4 (checkpoints /w/checkpoints) resumed from /x/ckpt-2.pt, written by "
                                  "experiment 2")


def test_a_project_left_without_a_run_is_named_unless_the_user_stopped_it():
    assert checks.holds_a_run({1}, {2}, False, False) == []
    assert checks.holds_a_run(set(), set(), False, False) == []
    assert checks.holds_a_run({1}, set(), True, False) == []
    assert checks.holds_a_run({1}, set(), False, False)
    assert "its queue had more" in checks.holds_a_run({1}, set(), True, True)[0]
    assert checks.holds_a_run({4, 5}, set(), False, False, exempt={4, 5}) == []  # a sweep's, at their budget


def test_an_environment_not_its_launch_s_is_named():
    good = dict([run(1, MAIN, start(1, ORCH_CHECKPOINT_DIR=MAIN, MODEL_TAG="t1", shell_tag="s0"), MODEL_TAG="t1",
                     shell_tag="s0")])
    assert checks.environments(good, {1: {"MODEL_TAG": "t1", "shell_tag": "s0"}}) == []
    stale = dict([run(2, MAIN, start(2, ORCH_CHECKPOINT_DIR=MAIN, MODEL_TAG="t1", shell_tag="s0",
                                     LEAK_VAR="from-shell-0"), MODEL_TAG="t2", shell_tag="s1")])
    (problem,) = checks.environments(stale, {2: {"MODEL_TAG": "t2", "shell_tag": "s1"}})
    assert "MODEL_TAG='t1' (its launch: 't2')" in problem and "LEAK_VAR='from-shell-0'" in problem
    assert "shell_tag='s0' (its launch: 's1')" in problem


def test_records_that_differ_from_the_target_are_named():
    probe = {"runs": {f"{REG}-1": {"state": "live"}, f"{REG}-2": {"state": "ended"}}}
    rows = [{"id": 1, "status": "running"}, {"id": 2, "status": "finished"}]
    assert checks.records(rows, {"experiment": 1, "state": "running", "live": []}, probe, probe, REG) == []
    wrong = [{"id": 1, "status": "stopped"}, {"id": 2, "status": "running"}, {"id": 3, "status": "launching"}]
    problems = checks.records(wrong, {"experiment": 2, "state": "running", "live": []}, probe, probe, REG)
    assert "experiment 1 is stopped in the registry and live on the target" in problems
    assert "experiment 2 is running in the registry, its run on the target had ended" in problems
    assert "experiment 3 is still launching in the registry" in problems
    assert "orch status --json shows live [2], the target [1] (ended before: [2])" in problems


def test_a_run_that_ends_while_the_records_are_read_is_judged_at_the_next_step():
    before = {"runs": {f"{REG}-1": {"state": "live"}}}
    after = {"runs": {f"{REG}-1": {"state": "ended"}}}
    status = {"experiment": 1, "state": "running", "live": []}
    assert checks.records([{"id": 1, "status": "running"}], status, before, after, REG) == []
    assert checks.records([{"id": 1, "status": "running"}], status, after, after, REG)


def test_a_secret_or_a_lost_checkpoint_is_named():
    assert checks.no_secret(["/w/orch/runs/x/launch.json"]) == [
        "the secret's value is at rest on the target in /w/orch/runs/x/launch.json"]
    seen = {"/w/checkpoints/ckpt-1.pt": "aa", "/w/checkpoints/ckpt-2.pt": "bb"}
    files = {"/w/checkpoints.trash/20261204T000000Z-x/ckpt-1.pt": "aa"}
    assert checks.kept(seen, files) == ["checkpoint /w/checkpoints/ckpt-2.pt is gone from its folder and every "
                                        "trash entry"]
