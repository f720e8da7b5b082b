"""How busy the GPUs a run was given are, over time: a short series kept in its registry row.

Each ``orch status`` of a run placed with ``--gpus`` adds what nvidia-smi reads of its GPUs (utilisation %,
memory MiB), at most one sample per ``EVERY_S`` and the last ``KEEP`` of them. ``idle_note`` flags GPUs that
stayed under ``IDLE_UTIL`` % for ``[metrics] gpu_idle_after`` seconds; ``compare`` reads ``summary``.

    series = [[1733059200.0, [[87, 1024], [91, 1030]]], ...]   # one pair per GPU, in the record's order
"""

from __future__ import annotations

from typing import Any

IDLE_UTIL = 10  # %: under this, a GPU does next to nothing
EVERY_S = 10.0
KEEP = 240


def reading(given: list[dict], gpus: list[dict]) -> list[list[float]] | None:
    """``[[util, mem], …]`` of the GPUs ``given`` (matched by UUID) in what status read; None when any is missing."""
    by_uuid = {g.get("uuid"): g for g in gpus}
    out = []
    for g in given:
        now = by_uuid.get(g.get("uuid"))
        try:
            out.append([float(now["util"]), float(now["mem_used_mib"])])
        except (TypeError, KeyError, ValueError):
            return None
    return out


def added(series: list | None, now: float, values: list) -> list | None:
    """The series with ``values`` at ``now`` appended; None when the last sample is too recent to add one."""
    series = list(series or [])
    if series and now - series[-1][0] < EVERY_S:
        return None
    return (series + [[round(now, 1), values]])[-KEEP:]


def _which(given: list[dict]) -> str:
    idx = [int(g["index"]) for g in given]
    if len(idx) == 1:
        return f"GPU {idx[0]}"
    if idx == list(range(idx[0], idx[0] + len(idx))):
        return f"GPUs {idx[0]}–{idx[-1]}"
    return "GPUs " + ", ".join(map(str, idx))


def _span(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


def idle_note(series: list | None, given: list[dict], idle_after: float | None, now: float) -> str | None:
    """``GPUs 0–7 at 3% for 10 min: input-bound?`` when every sample of the last ``idle_after`` s (and the
    ones before, back to the first busy one) has every GPU under ``IDLE_UTIL`` %."""
    if not idle_after or not series:
        return None
    start, top = None, 0.0
    for t, values in reversed(series):
        if any(u >= IDLE_UTIL for u, _ in values):
            break
        start, top = t, max([top, *(u for u, _ in values)])
    if start is None or now - start < idle_after:
        return None
    return f"{_which(given)} at {top:.0f}% for {_span(now - start)}: input-bound?"


def record(registry, exp, gpus: list[dict], idle_after: float | None, now: float) -> list[str]:
    """Add this status's reading to ``exp``'s series; the notes status shows (the idle flag)."""
    if not exp or not exp.gpus or exp.status != "running":
        return []
    values = reading(exp.gpus, gpus)
    series = exp.gpu_series
    if values is not None:
        grown = added(series, now, values)
        if grown is not None:
            series = grown
            registry.update(exp.id, gpu_series=series)
    note = idle_note(series, exp.gpus, idle_after, now)
    return [note] if note else []


def summary(series: list | None) -> dict[str, Any]:
    """For compare: mean utilisation, peak memory and the utilisation over time (mean of the GPUs)."""
    if not series:
        return {"util_mean": None, "mem_peak_mib": None, "util": []}
    per_sample = [sum(u for u, _ in values) / len(values) for _, values in series if values]
    peak = max((m for _, values in series for _, m in values), default=None)
    return {"util_mean": sum(per_sample) / len(per_sample) if per_sample else None, "mem_peak_mib": peak,
            "util": per_sample}
