"""The guard's pure parts: its metric reading (both runs alike), its verdict over the window, and its settings."""

from __future__ import annotations

import pytest

from orchestrator.agent.watch.guard import Spec, compare, parse_line
from orchestrator.config import load_settings
from orchestrator.errors import ConfigError
from orchestrator.records.end_reason import describe, guard_reason


@pytest.mark.parametrize("line, expected", [
    ("step=12 loss=2.31 tok_s=31800", {"step": 12, "loss": 2.31, "tok_s": 31800.0}),
    ("step: 12  loss: 2.31  tps: 31,800", {"step": 12, "loss": 2.31, "tok_s": 31800.0}),
    ("step=12/200 loss=2.5 throughput: 31.8 Ktok/s", {"step": 12, "loss": 2.5, "tok_s": 31800.0}),
    ('{"step": 12, "train_loss": 2.0, "steps_s": 3.5}', {"step": 12, "loss": 2.0, "steps_s": 3.5}),
    ("\x1b[32mstep=3\x1b[0m loss=1e-2", {"step": 3, "loss": 0.01}),
    ("epoch 1 done, loss=2.0", None),
    ("[orch] attempt 2 of 3 after exit code 1", None),
])
def test_a_line_is_read_for_its_step_loss_and_rate(line, expected):
    assert parse_line(line) == expected


def spec(**kw) -> Spec:
    raw = {"steps": 20, "min_throughput": 0.9, "max_loss_ratio": None, "on_fail": "rollback",
           "parent": {"id": 12, "registry": "ab"}, "restore": {"id": 14, "registry": "ab"}} | kw
    return Spec.from_dict(raw)  # type: ignore[return-value]


def series(first: int, last: int, tok_s: float, loss: float = 2.0) -> list[dict]:
    return [{"step": s, "loss": loss, "tok_s": tok_s} for s in range(first, last + 1)]


def test_half_the_parents_throughput_fails_in_the_issues_words():
    out = compare(spec(steps=200), series(1, 200, 11_900), series(1, 500, 32_000), first=1)
    assert out["failure"] == "throughput 11.9 Ktok/s < 0.9 × 32.0 Ktok/s of exp 12 over steps 20–200"
    assert out["ratio"] == pytest.approx(11.9 / 32)


def test_the_first_tenth_of_the_window_is_left_out_and_a_faster_run_holds():
    slow_start = series(1, 19, 100) + series(20, 200, 31_000)
    out = compare(spec(steps=200), slow_start, series(1, 200, 32_000), first=1)
    assert "failure" not in out and out["ratio"] == pytest.approx(31 / 32) and (out["from"], out["to"]) == (20, 200)


def test_a_parent_that_never_logged_those_steps_is_compared_at_its_latest_rate():
    out = compare(spec(), series(1, 20, 10_000), series(500, 600, 20_000), first=1)
    assert out["failure"].startswith("throughput 10.0 Ktok/s < 0.9 × 20.0 Ktok/s")


def test_loss_against_the_parents_at_the_same_steps():
    out = compare(spec(max_loss_ratio=1.1), series(1, 20, 32_000, loss=3.0), series(1, 20, 32_000, loss=2.0),
                  first=1)
    assert out["failure"] == "loss 3 > 1.1 × 2 of exp 12 over steps 2–20"
    assert "failure" not in compare(spec(), series(1, 20, 32_000, loss=3.0), series(1, 20, 32_000), first=1)


def test_the_guard_can_judge_the_evaluation_loss_at_the_steps_both_evaluated():
    from orchestrator.agent.watch.guard import read_points

    def log(tmp, val: float) -> list[dict]:
        path = tmp / f"train-{val}.log"
        lines = [f"step={s} loss=2.0 tok_s=32000" for s in range(1, 21)]
        lines.insert(10, f"{{'eval_loss': {val}, 'epoch': 0.5}}")  # Hugging Face's eval dict: no step of its own
        lines.append(f"{{'eval_loss': {val}, 'epoch': 1.0}}")
        path.write_text("\n".join(lines) + "\n")
        return read_points(str(path))

    import pathlib
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        mine, parents = log(pathlib.Path(tmp), 3.0), log(pathlib.Path(tmp), 2.0)
    assert [p for p in mine if "val_loss" in p] == [{"step": 10, "val_loss": 3.0}, {"step": 20, "val_loss": 3.0}]
    assert "failure" not in compare(spec(max_loss_ratio=1.1), mine, parents, first=1)  # the training losses agree
    out = compare(spec(max_loss_ratio=1.1, loss="val_loss"), mine, parents, first=1)
    assert out["failure"] == "val_loss 3 > 1.1 × 2 of exp 12 over steps 2–20"


def test_the_end_reasons_of_a_guarded_run():
    why = "throughput 11.9 Ktok/s < 0.9 × 32.0 Ktok/s of exp 12 over steps 20–200"
    assert guard_reason({"state": "rolled back", "reason": why, "on_fail": "rollback"}) == f"rolled back: {why}"
    assert describe({"state": "stopped", "guard": {"state": "failed", "reason": why, "on_fail": "stop"}}) == \
        f'guard failed: {why}; stopped ([guard] on_fail = "stop")'
    assert guard_reason({"state": "passed", "ratio": 1.02}) is None
    assert describe({"state": "stopped", "stopped_by": None, "guard": {"state": "passed"}}) is None


@pytest.mark.parametrize("flag, expected", [
    ("guard.on_fail=undo", "'rollback' or 'stop'"),
    ("guard.steps=1", "guard.steps"),
    ("guard.min_throughput=0", "guard.min_throughput"),
    ("guard.max_loss_ratio=-1", "guard.max_loss_ratio"),
])
def test_bad_guard_settings_name_the_key(tmp_path, flag, expected):
    cfg = tmp_path / "orch.toml"
    cfg.write_text("")
    with pytest.raises(ConfigError) as err:
        load_settings(cfg, env={}, overrides=[flag])
    assert expected in err.value.message and err.value.hint


def test_guard_defaults_as_documented(tmp_path):
    cfg = tmp_path / "orch.toml"
    cfg.write_text("[guard]\nmax_loss_ratio = 1.2\n")
    g = load_settings(cfg, env={}).guard
    assert g.spec() == {"steps": 200, "min_throughput": 0.9, "max_loss_ratio": 1.2, "on_fail": "rollback",
                        "loss": "loss"}
