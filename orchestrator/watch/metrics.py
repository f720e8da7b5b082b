"""Training metrics read from plain log lines, with no change to the training code.

Pure and stdlib-only (it sits on the CLI's start-up path): a line goes in, a metric event comes out.

    >>> Parser().parse_line("step=12 loss=3.2141 Ktok/s=15.2 epoch=0")
    {'step': 12.0, 'loss': 3.2141, 'tok_s': 15200.0, 'epoch': 0.0}

Parsing lives in ``logparse.py`` (``Parser`` is re-exported here): the formats of nanoGPT, Hugging Face,
Lightning, torchtitan and Megatron-LM, ``key=value`` pairs, JSON lines, and extra regexes from
``[metrics] patterns``. On top of the
events, this module has a bounded ``Series`` that keeps spikes, a robust spike detector, and the
small summaries ``orch status`` and ``orch experiments compare`` show.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from orchestrator.errors import InputError


def __getattr__(name: str) -> Any:
    """``Parser`` and ``Event``, part of this module's API, loaded from ``logparse`` when first asked for: a status
    that reads the series its run's supervisor kept never loads the log reader."""
    if name in ("Parser", "Event"):
        from orchestrator.watch.logparse import Event, Parser

        return Parser if name == "Parser" else Event
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Series:
    """At most ``max_points`` (x, y) points of one metric, however long the run.

    Points fall into buckets of ``stride`` raw points; each bucket keeps its lowest and its highest
    point, so a one-step spike survives any amount of downsampling. When the buckets fill up,
    neighbours merge and the stride doubles. The newest raw point is always kept.
    """

    def __init__(self, max_points: int = 512) -> None:
        if max_points < 9:
            raise InputError(f"a metric series needs max_points >= 9, got {max_points}",
                             "raise the series size")
        self.max_points = max_points
        self.stride = 1
        self.count = 0
        self.skipped = 0
        self.last: tuple[float, float] | None = None
        self._cap = (max_points - 3) // 2
        self._buckets: list[list[float]] = []  # [x_lo, y_lo, x_hi, y_hi]
        self._open: list[float] | None = None
        self._open_n = 0

    def add(self, x: float, y: float) -> None:
        """Append one point; non-finite values are counted in ``skipped`` and not plotted."""
        if not math.isfinite(y):
            self.skipped += 1
            return
        self.count += 1
        self.last = (x, y)
        b = self._open
        if b is None:
            self._open = [x, y, x, y]
        else:
            if y < b[1]:
                b[0], b[1] = x, y
            if y > b[3]:
                b[2], b[3] = x, y
        self._open_n += 1
        if self._open_n >= self.stride:
            self._buckets.append(self._open)  # type: ignore[arg-type]
            self._open, self._open_n = None, 0
            if len(self._buckets) > self._cap:
                self._halve()

    def _halve(self) -> None:
        old = self._buckets
        merged = [_merge(old[i], old[i + 1]) for i in range(0, len(old) - 1, 2)]
        if len(old) % 2:
            self._open, self._open_n = old[-1], self.stride
        self._buckets = merged
        self.stride *= 2

    def points(self) -> list[tuple[float, float]]:
        """The kept points in the order they were added (at most ``max_points``)."""
        out: list[tuple[float, float]] = []
        tail = [self._open] if self._open is not None else []
        for x_lo, y_lo, x_hi, y_hi in self._buckets + tail:
            if x_lo == x_hi:
                out.append((x_lo, y_lo))
            elif x_lo < x_hi:
                out += [(x_lo, y_lo), (x_hi, y_hi)]
            else:
                out += [(x_hi, y_hi), (x_lo, y_lo)]
        if self.last is not None and (not out or out[-1][0] < self.last[0]):
            out.append(self.last)
        return out

    def values(self) -> list[float]:
        return [y for _, y in self.points()]

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_points": self.max_points, "stride": self.stride, "count": self.count,
            "skipped": self.skipped, "last": list(self.last) if self.last else None,
            "buckets": [list(b) for b in self._buckets],
            "open": list(self._open) if self._open else None, "open_n": self._open_n,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Series:
        try:
            s = cls(int(data["max_points"]))
            s.stride, s.count = int(data["stride"]), int(data["count"])
            s.skipped, s._open_n = int(data["skipped"]), int(data["open_n"])
            s.last = (float(data["last"][0]), float(data["last"][1])) if data["last"] else None
            s._buckets = [[float(v) for v in b] for b in data["buckets"]]
            s._open = [float(v) for v in data["open"]] if data["open"] else None
            if any(len(b) != 4 for b in s._buckets) or len(s._buckets) > s._cap:
                raise ValueError("bad bucket table")
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise InputError(f"stored metric series is malformed: {exc}",
                             "re-read the run's log to rebuild its metrics") from exc
        return s


def series_of(stored: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Every metric of an experiment, as series: ``registry.metrics(id)`` in, ``{name: {"kind": "train" | "eval" |
    "summary", "points": [(step, value), ...]}}`` out, training metrics first (``loss``, ``lr``, ``tok_s``, …),
    then the evaluations' (``val_loss``, ``test_acc1``), then the summaries'. A point's step is the training step
    the line came at (an evaluation: the last training step before it)."""
    from orchestrator.agent.metrics.metric_names import kind_of_metric

    order = {"train": 0, "eval": 1, "summary": 2}
    series = dict((stored or {}).get("series") or {})
    named = sorted(series, key=lambda n: (order[kind_of_metric(n)], n))
    return {name: {"kind": kind_of_metric(name), "points": Series.from_dict(series[name]).points()} for name in named}


def _merge(a: list[float], b: list[float]) -> list[float]:
    lo = a[:2] if a[1] <= b[1] else b[:2]
    hi = a[2:] if a[3] >= b[3] else b[2:]
    return lo + hi


class Spike(NamedTuple):
    index: int
    step: float | None
    value: float
    baseline: float


def find_spikes(
    values: Sequence[float],
    steps: Sequence[float] | None = None,
    *,
    window: int = 50,
    min_history: int = 10,
    z: float = 6.0,
    min_rel: float = 0.25,
    min_abs: float = 0.05,
) -> list[Spike]:
    """Points that jump far above the trailing median of the last ``window`` finite values.

    A point is a spike when ``value - median`` exceeds all of ``z`` robust standard deviations
    (1.4826 x MAD), ``min_abs`` and ``min_rel x |median|``: the MAD rule follows the noise level,
    the floors keep flat, low-noise curves from flagging harmless wiggles. Non-finite values
    (NaN/inf loss) are always spikes. Only upward jumps count: a loss falling fast is healthy.
    """
    spikes: list[Spike] = []
    recent: deque[float] = deque()
    ordered: list[float] = []
    for i, v in enumerate(values):
        step = steps[i] if steps is not None else None
        n = len(ordered)
        med = _middle(ordered) if n else math.nan
        if not math.isfinite(v):
            spikes.append(Spike(i, step, v, med))
            continue
        if n >= min_history:
            jump = v - med
            if jump > min_abs and jump > min_rel * abs(med):
                mad = _middle(sorted(abs(o - med) for o in ordered))
                if jump > z * 1.4826 * mad:
                    spikes.append(Spike(i, step, v, med))
        recent.append(v)
        bisect.insort(ordered, v)
        if len(recent) > window:
            del ordered[bisect.bisect_left(ordered, recent.popleft())]
    return spikes


def spike_episodes(spikes: Sequence[Spike]) -> list[list[Spike]]:
    """Groups spikes at consecutive indices: 4.6 then 6.4 on the next logged step is one episode."""
    episodes: list[list[Spike]] = []
    for s in spikes:
        if episodes and episodes[-1][-1].index == s.index - 1:
            episodes[-1].append(s)
        else:
            episodes.append([s])
    return episodes


# a metric whose name says more is better (accuracy, scores, throughput); any other (a loss, a perplexity, an
# error rate) is better lower. Matched on the name's words, so ``val_acc``, ``top1_accuracy`` and ``tok_s`` read alike.
HIGHER_IS_BETTER = frozenset({"acc", "accuracy", "acc1", "acc5", "top1", "top5", "f1", "bleu", "rouge", "rouge1",
                              "rouge2", "rougel", "auc", "auroc", "map", "iou", "miou", "dice", "precision",
                              "recall", "score", "reward", "return", "mfu", "tok", "samples", "steps", "it",
                              "throughput", "r2", "em", "exact", "match", "psnr", "ssim"})


def better(name: str) -> str:
    """``"max"`` where a higher value of the metric ``name`` is better, else ``"min"``::

        >>> better("val_loss"), better("val_acc"), better("tok_s"), better("ppl")
        ('min', 'max', 'max', 'min')
    """
    words = name.lower().replace("-", "_").replace("/", "_").replace(".", "_").split("_")
    return "max" if any(w in HIGHER_IS_BETTER for w in words) else "min"


def best_of(series: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """Each stored series' best value, by ``better``: exact however downsampled (a bucket keeps its lowest and
    its highest point)."""
    out: dict[str, float] = {}
    for name, data in series.items():
        try:
            values = Series.from_dict(data).values()
        except Exception:  # a malformed stored series has no best
            continue
        if values:
            out[name] = max(values) if better(name) == "max" else min(values)
    return out


def _middle(ordered: Sequence[float]) -> float:
    """Median of an already sorted sequence."""
    n = len(ordered)
    return (ordered[n // 2] + ordered[(n - 1) // 2]) / 2


def format_size(n: float | None) -> str:
    """Bytes for people: ``4.9 KB``, ``1.2 GB``."""
    n = float(n or 0)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def format_duration(seconds: float | None) -> str:
    """``45s``, ``12m 05s``, ``3h 07m``, ``2d 04h``; ``-`` when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = int(round(max(0.0, seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600:02d}h"


def format_rate(tok_s: float, unit: str = "tok/s") -> str:
    """``950 tok/s``, ``11.9 Ktok/s``, ``1.20 Mtok/s``; with ``unit="steps/s"``: ``170.6 steps/s``, ``0.52 steps/s``."""
    if unit != "tok/s":
        return f"{tok_s:.3g} {unit}" if tok_s < 100 else f"{tok_s:.1f} {unit}"
    if tok_s >= 1e6:
        return f"{tok_s / 1e6:.2f} Mtok/s"
    if tok_s >= 1e3:
        return f"{tok_s / 1e3:.1f} Ktok/s"
    return f"{tok_s:.0f} tok/s"


def throughput_change(current: float, previous: float | None, against: str = "previous",
                      unit: str = "tok/s") -> str:
    """``11.9 Ktok/s, −63% vs exp 12``: the current rate and its change against another run (same unit)."""
    text = format_rate(current, unit)
    if not previous or previous <= 0:
        return text
    pct = round((current - previous) / previous * 100)
    sign = "+" if pct > 0 else ("\u2212" if pct < 0 else "±")
    return f"{text}, {sign}{abs(pct)}% vs {against}"


_BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int = 40) -> str:
    """Unicode block sparkline; with more values than ``width`` each cell shows its bucket's max."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite or width <= 0:
        return ""
    cells: list[float] = list(values)
    if len(values) > width:
        cells = []
        for c in range(width):
            chunk = [v for v in values[c * len(values) // width:(c + 1) * len(values) // width]
                     if math.isfinite(v)]
            cells.append(max(chunk) if chunk else math.nan)
    lo, hi = min(finite), max(finite)
    top = len(_BLOCKS) - 1
    out = []
    for v in cells:
        if not math.isfinite(v):
            out.append(" ")
        elif hi == lo:
            out.append(_BLOCKS[top // 2])
        else:
            out.append(_BLOCKS[round((v - lo) / (hi - lo) * top)])
    return "".join(out)
