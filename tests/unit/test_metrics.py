"""orchestrator.watch.metrics: parsing log lines, bounded series, spikes and the summaries built on them."""

from __future__ import annotations

import ast
import json
import math
import random
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.watch import metrics
from orchestrator.errors import ConfigError, InputError
from orchestrator.watch.metrics import Parser, Series, find_spikes, format_duration, format_rate, sparkline, spike_episodes, throughput_change

# -- parsing -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("step=12 loss=3.2141 tok/s=15234 epoch=0",
         {"step": 12, "loss": 3.2141, "tok_s": 15234, "epoch": 0}),
        ("step: 7, loss: 0.93, Ktok/s: 11.9, lr: 3e-4, grad_norm: 1.5",
         {"step": 7, "loss": 0.93, "tok_s": 11900, "lr": 3e-4, "grad_norm": 1.5}),
        ("[2026-11-29 09:32:22] iter 4 | step: 40/1000 | train_loss: 2.5",
         {"step": 40, "total_steps": 1000, "loss": 2.5}),
        ("total_steps=5000", {"total_steps": 5000}),
        ("{'loss': 2.5, 'learning_rate': 5e-05, 'epoch': 0.1}", {"loss": 2.5, "lr": 5e-05, "epoch": 0.1}),
        ("tokens: 1.2B tok/s=12.5K", {"tokens": 1.2e9, "tok_s": 12500}),
        ('{"step": 3, "loss": 4.5, "tokens_per_sec": 900, "time": 1700000000.5, "name": "x"}',
         {"step": 3, "loss": 4.5, "tok_s": 900, "t": 1700000000.5}),
    ],
)
def test_default_formats(line: str, expected: dict[str, float]) -> None:
    assert Parser().parse_line(line) == pytest.approx(expected)


@pytest.mark.parametrize(
    "line",
    [
        "",
        "validation started",
        "Saving checkpoint to checkpoints/ckpt-000120.npz",
        "2026-11-29T09:32:22 worker ready: host=ct101",
        "loss=3ms",
        "val=1 xloss=2 myloss: 3",
        '{"loss": "high"}',
        "[1, 2, 3]",
    ],
)
def test_lines_without_metrics(line: str) -> None:
    assert Parser().parse_line(line) is None


def test_nan_loss_is_reported_not_dropped() -> None:
    event = Parser().parse_line("step=9 loss=nan")
    assert event is not None and event["step"] == 9 and math.isnan(event["loss"])


def test_broken_json_falls_back_to_pairs() -> None:
    assert Parser().parse_line('{"step": 3, loss=2.0') == {"step": 3.0, "loss": 2.0}


def test_user_patterns_add_and_override() -> None:
    parser = Parser({"loss": r"L=([0-9.]+)", "gpu_mem": r"mem ([0-9.]+)G", "Ktok/s": r"speed ([0-9.]+)k"})
    assert parser.parse_line("it 5 L=0.75 loss=9.9 mem 21.5G speed 3.5k") == {
        "loss": 0.75, "gpu_mem": 21.5, "tok_s": 3500.0,
    }
    assert parser.parse_line("L=.") is None


@pytest.mark.parametrize(
    ("patterns", "words"),
    [
        ({"loss": "L=([0-9.]+"}, ["'loss'", "not a valid regex"]),
        ({"lr": "lr=[0-9.]+"}, ["'lr'", "0 groups"]),
        ({"gn": "(g)=([0-9.]+)"}, ["'gn'", "2 groups"]),
        ({"x": 3}, ["'x'", "not a string"]),
    ],
)
def test_bad_user_pattern_names_the_key(patterns: dict, words: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        Parser(patterns)
    for word in words:
        assert word in info.value.message
    assert info.value.hint


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_parser_never_raises(line: str) -> None:
    event = Parser().parse_line(line)
    assert event is None or all(isinstance(v, float) for v in event.values())


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 10**9),
    st.floats(0, 1e6, allow_nan=False),
    st.floats(1e-9, 10, allow_nan=False),
    st.sampled_from(["{k}={v}", "{k}: {v}", "{k} = {v}"]),
)
def test_formatted_values_parse_back(step: int, loss: float, lr: float, form: str) -> None:
    line = " ".join(form.format(k=k, v=v) for k, v in (("step", step), ("loss", loss), ("lr", lr)))
    assert Parser().parse_line(line) == {"step": float(step), "loss": loss, "lr": lr}


# -- series ------------------------------------------------------------------------------------


def test_series_is_bounded_and_keeps_spikes_and_last() -> None:
    rng = random.Random(0)
    s = Series(64)
    values = [1.0 + rng.gauss(0, 0.01) for _ in range(100_000)]
    values[31_337] = 6.4
    values[77_000] = -3.0
    for i, v in enumerate(values):
        s.add(i, v)
    pts = s.points()
    assert len(pts) <= 64
    assert (31_337, 6.4) in pts and (77_000, -3.0) in pts
    assert pts[-1] == (99_999, values[-1])
    assert [x for x, _ in pts] == sorted(x for x, _ in pts)
    assert s.count == 100_000


def test_series_skips_non_finite_values() -> None:
    s = Series(16)
    for i, v in enumerate([1.0, math.nan, 2.0, math.inf]):
        s.add(i, v)
    assert s.values() == [1.0, 2.0] and s.skipped == 2 and s.count == 2


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=3000), st.integers(9, 100))
def test_series_bound_and_extremes_hold_for_any_input(values: list[float], cap: int) -> None:
    s = Series(cap)
    for i, v in enumerate(values):
        s.add(i, v)
    kept = s.values()
    assert len(kept) <= cap
    assert max(kept) == max(values) and min(kept) == min(values)


def test_series_json_round_trip_continues_identically() -> None:
    a = Series(32)
    for i in range(1000):
        a.add(i, math.sin(i / 10))
    b = Series.from_dict(json.loads(json.dumps(a.to_dict())))
    assert b.points() == a.points()
    for i in range(1000, 1500):
        a.add(i, math.cos(i))
        b.add(i, math.cos(i))
    assert b.to_dict() == a.to_dict()


@pytest.mark.parametrize(
    "broken",
    [{}, {"max_points": 32}, {**Series(32).to_dict(), "buckets": [[1, 2]]}, {**Series(32).to_dict(), "last": "x"}],
)
def test_series_from_malformed_dict(broken: dict) -> None:
    with pytest.raises(InputError, match="malformed"):
        Series.from_dict(broken)


def test_series_rejects_tiny_size() -> None:
    with pytest.raises(InputError):
        Series(3)


# -- spikes ------------------------------------------------------------------------------------

MOTIVATING = [0.93 + 0.01 * math.sin(i) for i in range(60)] + [4.6, 6.4] + [0.93 + 0.01 * math.cos(i) for i in range(30)]


def test_spike_fires_on_the_motivating_pattern() -> None:
    steps = [10 * i for i in range(len(MOTIVATING))]
    spikes = find_spikes(MOTIVATING, steps)
    assert [(s.index, s.step, s.value) for s in spikes] == [(60, 600, 4.6), (61, 610, 6.4)]
    assert spikes[0].baseline == pytest.approx(0.93, abs=0.02)
    assert [[s.index for s in ep] for ep in spike_episodes(spikes)] == [[60, 61]]


def test_nan_loss_is_a_spike() -> None:
    values = [1.0] * 20 + [math.nan] + [1.0] * 5
    assert [s.index for s in find_spikes(values)] == [20]


def test_fast_falling_loss_is_not_a_spike() -> None:
    assert find_spikes([10.0 * 0.9**i for i in range(300)]) == []


def healthy_curve(rng: random.Random, n: int = 2000) -> list[float]:
    """Exponential decay to a floor, relative + absolute gaussian noise, and a few mild bumps."""
    start, floor, tau = rng.uniform(3, 10), rng.uniform(0.5, 2.5), rng.uniform(n / 20, n / 2)
    rel, absolute = rng.choice([0.005, 0.01, 0.02, 0.05, 0.08]), rng.choice([0.0, 0.005, 0.02])
    curve = [floor + (start - floor) * math.exp(-i / tau) for i in range(n)]
    for _ in range(rng.randint(0, 4)):
        at, height, width = rng.randrange(50, n - 40), rng.uniform(0.03, 0.15), rng.randint(3, 30)
        for j in range(at, at + width):
            curve[j] *= 1 + height * math.sin(math.pi * (j - at) / width)
    return [x + rng.gauss(0, rel * x + absolute) for x in curve]


def test_false_positive_rate_on_healthy_curves_is_low() -> None:
    rng = random.Random(1)
    flagged = sum(bool(find_spikes(healthy_curve(rng))) for _ in range(200))
    assert flagged <= 2  # measured: 0 of 200


def test_doubling_spikes_are_found_on_healthy_curves() -> None:
    rng = random.Random(2)
    found = 0
    for _ in range(100):
        curve = healthy_curve(rng)
        at = rng.randrange(200, 1900)
        curve[at] *= 2
        found += any(s.index == at for s in find_spikes(curve))
    assert found >= 95  # measured: 99 of 100


# -- summaries ---------------------------------------------------------------------------------


def _status_summary(lines: list[str], *, started_s_ago: float, log_age_s: float = 0.0,
                    stall_after: float | None = None) -> dict:
    """What ``orch status`` shows of a running run whose log holds ``lines`` (metrics_view, as status calls it)."""
    import time as _time

    from orchestrator.config import Settings
    from orchestrator.records.experiments import Experiment
    from orchestrator.watch.metrics_view import ingest, summary

    settings = Settings.model_validate({"run": {"stall_after": stall_after}})
    series: dict = {}
    state: dict = {}
    ingest(settings, lines, series, state)
    now = _time.time()
    exp = Experiment(id=1, project="p", created=now - started_s_ago, target="local", revision="r", command=["x"])
    return summary(settings, exp, series, state, {"state": "running", "log_mtime": now - log_age_s}, None, now)


def test_status_summarizes_a_parsed_log() -> None:
    lines = ["total_steps=100"]
    for i, loss in enumerate(MOTIVATING[:70]):
        lines.append(json.dumps({"step": i, "loss": loss, "tok/s": 1000 + i}))
    s = _status_summary(lines, started_s_ago=138.0)
    assert s["step"] == 69 and s["total_steps"] == 100
    assert s["loss"] == MOTIVATING[69] and s["min_loss"] == min(MOTIVATING[:70])
    assert s["median_tok_s"] == 1034.5
    assert s["spikes"] == 1 and s["spike_steps"] == [60]
    assert s["eta_s"] == pytest.approx(62.0, rel=0.01)  # 31 steps left at 69 steps in 138 s
    assert s["eta"] == format_duration(s["eta_s"])


def test_status_of_a_log_without_metrics() -> None:
    s = _status_summary(["hello", "world"], started_s_ago=10.0)
    assert s["step"] is None and "spikes" not in s and "eta_s" not in s
    assert not s["notes"]  # a running run's first lines (its set-up) are no reason for a note yet
    s = _status_summary(["hello", "world"] * 10, started_s_ago=10.0)
    assert any(n.startswith("no metric line recognised in 20 lines") for n in s["notes"])


def test_the_note_proposes_a_pattern_that_reads_the_runs_own_lines() -> None:
    from orchestrator.watch.logparse import Parser

    lines = ["Using device: cpu"] + [f"#{i} :: Loss => {4 - i / 10:.3f} !!" for i in range(24)]
    note = next(n for n in _status_summary(lines, started_s_ago=10.0)["notes"] if n.startswith("no metric"))
    source = note.split("patterns = { loss = '")[1].split("' }")[0]
    assert "(it reads 24 of the 25 lines seen)" in note
    assert Parser({"loss": source}).parse_line(lines[5]) == {"loss": 3.6}  # the user's first edit works


def test_the_note_says_which_configured_pattern_matched() -> None:
    from orchestrator.watch.metrics_view import no_metrics_note

    note = no_metrics_note(3, ["Using device: cpu", "#1 :: Loss => 2.5", "#2 :: Loss => 2.4"],
                           {"loss": r"loss ([0-9.]+)", "acc": r"Loss => ([0-9.]+)"})
    assert "[metrics] patterns matched: loss 0 of 3 lines, acc 2 of 3 lines" in note


def test_status_says_stalled_past_the_stall_setting_and_only_notes_a_quiet_run_without_it() -> None:
    lines = ["step=1 loss=2.0", "step=2 loss=1.9"]
    assert not [n for n in _status_summary(lines, started_s_ago=900, log_age_s=100)["notes"] if "log line" in n]
    assert _status_summary(lines, started_s_ago=900, log_age_s=100, stall_after=60)["notes"] == \
        ["stalled: no new log line for 1m 40s"]
    assert _status_summary(lines, started_s_ago=900, log_age_s=400)["notes"] == ["no new log line for 6m 40s"]


def test_durations() -> None:
    assert [format_duration(x) for x in (None, 4.6, 725, 3 * 3600 + 7 * 60, 2 * 86400 + 4 * 3600)] == [
        "-", "5s", "12m 05s", "3h 07m", "2d 04h",
    ]


def test_rates_and_changes() -> None:
    assert [format_rate(x) for x in (950, 11_900, 1_200_000)] == ["950 tok/s", "11.9 Ktok/s", "1.20 Mtok/s"]
    assert throughput_change(11_900, 32_000, "exp 12") == "11.9 Ktok/s, \u221263% vs exp 12"
    assert throughput_change(25_100, 25_000) == "25.1 Ktok/s, ±0% vs previous"
    assert throughput_change(32_000, 25_100, "exp 3") == "32.0 Ktok/s, +27% vs exp 3"
    assert throughput_change(32_000, None) == "32.0 Ktok/s"


def test_sparkline() -> None:
    assert sparkline([]) == ""
    assert sparkline([1, 2, 3, 4, 5, 6, 7, 8]) == "▁▂▃▄▅▆▇█"
    assert sparkline([2.0, 2.0]) == "▄▄"
    assert sparkline([1.0, math.nan, 3.0]) == "▁ █"
    line = sparkline(MOTIVATING * 10, width=20)
    assert len(line) == 20 and line.count("█") == 10


@pytest.mark.parametrize("module", ["metrics", "logparse", "reading_key"])
def test_module_stays_pure(module: str) -> None:
    import importlib

    tree = ast.parse(Path(importlib.import_module(f"orchestrator.watch.{module}").__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module if node.module.startswith("orchestrator") else node.module.split(".")[0])
    allowed = {"orchestrator.errors", "orchestrator.watch.logparse", "orchestrator.watch.reading_key",
               "orchestrator.agent.metrics.metric_lines",
               "orchestrator.agent.metrics.metric_shapes", "orchestrator.agent.metrics.metric_names"}
    foreign = {m for m in imported if m not in sys.stdlib_module_names and m not in allowed}
    assert foreign == set()
    assert not imported & {"socket", "sqlite3", "subprocess", "os", "io", "pathlib"}


def test_eta_from_a_declared_token_total():
    import time as _time

    from orchestrator.config import Settings
    from orchestrator.records.experiments import Experiment
    from orchestrator.watch.metrics_view import ingest, summary

    settings = Settings()
    lines = ["total_tokens=2000000"] + [f"step={i} loss=1.0 tok/s=10000 tokens={i * 10000}" for i in range(1, 101)]
    series: dict = {}
    state: dict = {}
    ingest(settings, lines, series, state)
    assert state["total_tokens"] == 2e6 and state["tokens"] == 1e6
    now = _time.time()
    exp = Experiment(id=1, project="p", created=now - 100, target="local", revision="r", command=["x"])
    out = summary(settings, exp, series, state, {"state": "running", "log_mtime": now}, None, now)
    assert out["eta_s"] == pytest.approx(100.0)  # 1M tokens left at 10K tok/s


def test_an_experiment_recorded_before_the_renames_is_read_with_its_own_stall_setting_and_patterns():
    from orchestrator.config import Settings
    from orchestrator.records.experiments import Experiment
    from orchestrator.watch.metrics_view import as_recorded

    old = {"run": {"stall_timeout": 60.0}, "metrics": {"patterns": {"loss": "L=([0-9.]+)"}, "stall_after": 300.0}}
    exp = Experiment(id=1, project="p", created=0.0, target="local", revision="r", command=["x"], config=old)
    settings = as_recorded(Settings(), exp)
    assert settings.run.stall_after == 60.0 and settings.metrics.patterns == {"loss": "L=([0-9.]+)"}


def test_every_metric_of_an_experiment_as_series_train_then_eval() -> None:
    from orchestrator.config import Settings
    from orchestrator.watch.metrics import series_of
    from orchestrator.watch.metrics_view import ingest

    lines = ["| epoch   1 |   200/ 2983 batches | lr 20.00 | ms/batch 11.27 | loss  7.62 | ppl  2040.91",
             "| end of epoch   1 | time: 35.12s | valid loss  5.61 | valid ppl   273.39",
             "| End of training | test loss  5.00 | test ppl   148.41"]
    series: dict = {}
    ingest(Settings(), lines, series, {})
    got = series_of({"series": series})
    assert list(got) == ["loss", "lr", "ppl", "steps_s", "test_loss", "test_ppl", "val_loss", "val_ppl"]
    assert got["val_loss"] == {"kind": "eval", "points": [(200.0, 5.61)]} and got["loss"]["kind"] == "train"


def test_best_is_the_lowest_loss_and_the_highest_accuracy_however_downsampled():
    from orchestrator.watch.metrics import Series, best_of, better

    assert [better(n) for n in ("loss", "val_loss", "ppl", "val_acc", "top1_accuracy", "tok_s", "f1")] == \
        ["min", "min", "min", "max", "max", "max", "max"]
    loss, acc = Series(max_points=16), Series(max_points=16)
    for i in range(5000):  # far past what a series keeps: a one-step low and high still survive
        loss.add(i, 0.000558 if i == 1234 else 1.0 / (1 + i / 1000))
        acc.add(i, 0.9 if i == 4321 else 0.5)
    assert best_of({"loss": loss.to_dict(), "val_acc": acc.to_dict(), "bad": {"buckets": "x"}}) == \
        {"loss": 0.000558, "val_acc": 0.9}
