"""The GPU series of a run placed with --gpus, its idle flag and what compare reads of it."""

from __future__ import annotations

from orchestrator.watch import gpu_use

GIVEN = [{"index": i, "uuid": f"GPU-{i}"} for i in range(8)]


def test_a_reading_takes_the_runs_gpus_by_uuid():
    gpus = [{"index": "1", "uuid": "GPU-1", "util": "87", "mem_used_mib": "1024"},
            {"index": "0", "uuid": "GPU-0", "util": "3", "mem_used_mib": "500"}]
    assert gpu_use.reading(GIVEN[:2], gpus) == [[3.0, 500.0], [87.0, 1024.0]]
    assert gpu_use.reading(GIVEN[:3], gpus) is None  # a GPU status could not read


def test_the_series_is_short_and_sparse():
    series = None
    for t in range(0, 5000, 5):
        series = gpu_use.added(series, float(t), [[50.0, 1.0]]) or series
    assert len(series) == gpu_use.KEEP
    assert all(b[0] - a[0] >= gpu_use.EVERY_S for a, b in zip(series, series[1:]))


def test_idle_for_the_configured_time_is_flagged():
    busy = [[t, [[90.0, 1.0]] * 8] for t in (0.0, 30.0)]
    idle = [[t, [[3.0, 1.0], [2.0, 1.0]] + [[1.0, 1.0]] * 6] for t in (60.0, 300.0, 660.0)]
    assert gpu_use.idle_note(busy + idle, GIVEN, 600, now=660.0) == "GPUs 0–7 at 3% for 10 min: input-bound?"
    assert gpu_use.idle_note(busy + idle, GIVEN, 900, now=660.0) is None  # not idle long enough yet
    assert gpu_use.idle_note(busy + idle + [[700.0, [[40.0, 1.0]] * 8]], GIVEN, 600, now=700.0) is None
    assert gpu_use.idle_note(busy + idle, GIVEN, None, now=660.0) is None  # not configured
    assert gpu_use.idle_note([[0.0, [[1.0, 1.0]]], [30.0, [[1.0, 1.0]]]], [GIVEN[3]], 20, now=30.0) == \
        "GPU 3 at 1% for 30 s: input-bound?"


def test_compare_summary():
    got = gpu_use.summary([[0.0, [[80.0, 1000.0], [60.0, 2000.0]]], [10.0, [[20.0, 1500.0], [40.0, 2500.0]]]])
    assert got == {"util_mean": 50.0, "mem_peak_mib": 2500.0, "util": [70.0, 30.0]}
    assert gpu_use.summary(None)["util_mean"] is None
