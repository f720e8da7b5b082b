"""The few metrics a supervisor reads from its run's log: its step, loss and throughput, for the guard
(``guard.py``), the step budget (``budget.py``) and the ``spike`` and ``slow`` notifications.

The controller's parser (``watch/logparse.py``) knows every framework's format but does not ship with the agent;
this one reads ``key=value`` and ``key: value`` pairs, JSON lines, and ``step N`` / ``iter N`` (nanoGPT's
``iter 100: loss …``), which is what most training scripts print and what orch's examples print; orch's own lines
(``[orch] …``, ``orch: …``) are never read:

    >>> parse("step=120 loss=2.3125 tok/s=11873 epoch=0")
    {'step': 120.0, 'loss': 2.3125, 'tok_s': 11873.0}
    >>> parse('{"loss": 2.5, "tokens_per_sec": 900}')
    {'loss': 2.5, 'tok_s': 900.0}
    >>> parse("step=12/200 loss=2.5 throughput: 31.8 Ktok/s")
    {'step': 12.0, 'loss': 2.5, 'tok_s': 31800.0}
"""

from __future__ import annotations

import bisect
import json
import math
import re
from collections import deque

_KEYS = {"step": "step", "iter": "step", "iteration": "step", "global_step": "step",
         "loss": "loss", "train_loss": "loss", "training_loss": "loss", "train/loss": "loss", "lm_loss": "loss",
         "tok/s": "tok_s", "tok_s": "tok_s", "tokens/s": "tok_s", "tokens/sec": "tok_s", "tokens_per_sec": "tok_s",
         "tokens_per_s": "tok_s", "tokens_per_second": "tok_s", "tps": "tok_s", "ktok/s": "ktok_s",
         "ktok_s": "ktok_s",
         "it/s": "steps_s", "it_s": "steps_s", "steps/s": "steps_s", "steps_s": "steps_s",
         "steps_per_second": "steps_s"}
_PAIR = re.compile(r"""["']?(?P<key>[A-Za-z_][\w/]*)["']?\s*[=:]\s*"""
                   r"""(?P<val>[-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)(?:/\d+)?(?:(?P<unit>\s*K?tok/s)(?!\s*[=:]|\s+\d))?""",
                   re.IGNORECASE)
_COUNT = re.compile(r"(?:^|[\s,;|\[(])(?P<key>step|iter)\s+(?P<val>\d+)", re.IGNORECASE)  # "iter 100: loss …"
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def parse(line: str) -> dict[str, float]:
    """The step, loss and throughput (``tok_s``, else ``steps_s``) a line gives, the first of each; nothing for
    other lines and for orch's own."""
    text = _ANSI.sub("", line).strip()
    if text.startswith(("[orch]", "orch:")):
        return {}
    pairs: list[tuple[str, float]] = []
    if text.startswith("{"):
        try:
            obj = json.loads(text)
        except ValueError:
            obj = None
        if isinstance(obj, dict):
            pairs = [(str(k), float(v)) for k, v in obj.items()
                     if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not pairs:
        for m in _PAIR.finditer(text):
            try:
                value = float(m["val"].replace(",", ""))
            except ValueError:
                continue
            unit = m["unit"]
            pairs.append(("ktok_s" if unit and "K" in unit else "tok_s" if unit else m["key"], value))
        pairs += [(m["key"], float(m["val"])) for m in _COUNT.finditer(text)]
    out: dict[str, float] = {}
    for key, value in pairs:
        name = _KEYS.get(key.lower())
        if name == "ktok_s":
            name, value = "tok_s", value * 1000.0
        if name is not None and name not in out:
            out[name] = value
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
