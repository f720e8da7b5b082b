"""The few metrics a supervisor reads from its run's log, for the ``spike`` and ``slow`` notifications.

The controller's parser (``watch/logparse.py``) knows every framework's format but does not ship with the agent;
this one reads only ``key=value`` and ``key: value`` pairs (and JSON lines, which have the same shape), which is
what most training scripts print and what orch's examples print:

    >>> parse("step=120 loss=2.3125 tok/s=11873 epoch=0")
    {'step': 120.0, 'loss': 2.3125, 'tok_s': 11873.0}
    >>> parse('{"loss": 2.5, "tokens_per_sec": 900}')
    {'loss': 2.5, 'tok_s': 900.0}
"""

from __future__ import annotations

import bisect
import math
import re
from collections import deque

_KEYS = {"step": "step", "iter": "step", "iteration": "step", "global_step": "step",
         "loss": "loss", "train_loss": "loss", "training_loss": "loss", "train/loss": "loss", "lm_loss": "loss",
         "tok/s": "tok_s", "tok_s": "tok_s", "tokens/s": "tok_s", "tokens/sec": "tok_s", "tokens_per_sec": "tok_s",
         "tokens_per_second": "tok_s", "tps": "tok_s",
         "it/s": "steps_s", "steps/s": "steps_s", "steps_per_second": "steps_s"}
_PAIR = re.compile(r"""["']?([A-Za-z_][\w/]*)["']?\s*[=:]\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)""",
                   re.IGNORECASE)


def parse(line: str) -> dict[str, float]:
    """The step, loss and throughput a line gives (the first of each); nothing for other lines."""
    out: dict[str, float] = {}
    for key, value in _PAIR.findall(line):
        name = _KEYS.get(key.lower())
        if name is not None and name not in out:
            out[name] = float(value)
    return out


def _middle(ordered: list[float]) -> float:
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


class Spikes:
    """Upward loss jumps against the trailing median, as ``orch status`` finds them (``watch/metrics.py``):
    a spike exceeds 6 robust standard deviations (1.4826 x MAD), 0.05 and 25% of the median; NaN or inf always."""

    def __init__(self, window: int = 50, min_history: int = 10, z: float = 6.0, min_rel: float = 0.25,
                 min_abs: float = 0.05) -> None:
        self.window, self.min_history, self.z, self.min_rel, self.min_abs = window, min_history, z, min_rel, min_abs
        self.recent: deque[float] = deque()
        self.ordered: list[float] = []

    def add(self, value: float) -> float | None:
        """The trailing median when ``value`` is a spike, else None."""
        med = _middle(self.ordered) if self.ordered else math.nan
        if not math.isfinite(value):
            return med
        spike = None
        if len(self.ordered) >= self.min_history:
            jump = value - med
            if jump > self.min_abs and jump > self.min_rel * abs(med):
                mad = _middle(sorted(abs(o - med) for o in self.ordered))
                if jump > self.z * 1.4826 * mad:
                    spike = med
        self.recent.append(value)
        bisect.insort(self.ordered, value)
        if len(self.recent) > self.window:
            del self.ordered[bisect.bisect_left(self.ordered, self.recent.popleft())]
        return spike


class Rate:
    """The median of the last ``window`` throughput readings, once there are that many."""

    def __init__(self, window: int = 20) -> None:
        self.window = window
        self.recent: deque[float] = deque(maxlen=window)

    def add(self, value: float) -> float | None:
        if math.isfinite(value) and value > 0:
            self.recent.append(value)
        return _middle(sorted(self.recent)) if len(self.recent) == self.window else None
