"""The one metric reader, on the target and on the controller: a log line in, ``{metric: value}`` out.

The supervisor reads its run's log with it (the guard, ``guard.py``; the step budget, ``budget.py``; the ``spike``
and ``slow`` notifications), and the controller imports it (``watch/logparse.py`` adds the user's
``[metrics] patterns``), so both read a line alike. Per-framework formats first (``metric_formats``), then the
general shapes (``metric_shapes``, which says how names are made: ``loss``, ``val_loss``, ``test_acc1``, ``lr``,
``tok_s``)::

    >>> Reader().read("| epoch   1 |   200/ 2983 batches | lr 20.00 | ms/batch 11.27 | loss  7.62 | ppl  2040.91")
    {'epoch': 1.0, 'lr': 20.0, 'loss': 7.62, 'ppl': 2040.91, 'steps_s': 88.73114463176574, 'step': 200.0}
    >>> Reader().read("Test set: Average loss: 0.0500, Accuracy: 9800/10000 (98%)")
    {'test_loss': 0.05, 'test_acc': 0.98}

A ``Reader`` remembers what a line needs from the lines before it: the epoch a Keras ``Epoch 1/10`` line
opened, whether epochs count from 0 or 1, Hugging Face's ``***** eval metrics *****`` section, and the kind of
the last metric line (ImageNet's `` * Acc@1 …`` closes its evaluation). A counter that restarts each epoch
(``[ 10/5005]``, ``200/ 2983 batches``) becomes a global step: (epoch - first epoch) x per epoch + offset, and
with the number of epochs known, ``total_steps``. orch's own lines (``[orch] …``, ``orch: …``) are never read.
"""

from __future__ import annotations

import bisect
import math
import re
from collections import deque

from .metric_formats import framework
from .metric_shapes import STRUCTURAL, Event, dict_found, dict_items, event, kind_of, scan, section

_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
_FIELD = re.compile(r"^\s+\S+\s*[=:]")  # "  eval_loss = 0.35", a line of a Hugging Face metrics section
AGENT_KEYS = ("step", "loss", "tok_s", "steps_s", "samples_s", "val_loss", "test_loss")


def plain(text: str) -> str:
    """``text`` without its ANSI escapes (colours, cursor moves), as people read it."""
    return _ANSI.sub("", text) if "\x1b" in text else text


class Reader:
    """Reads the lines of one log in order (``read`` one update, ``events`` a whole line); ``state`` and
    ``Reader(state)`` carry what it remembers across reads of the same log."""

    __slots__ = ("base", "epoch", "epochs", "section", "last")

    def __init__(self, state: dict | None = None) -> None:
        state = state or {}
        self.base: float | None = state.get("base")  # the first epoch's number: 0 or 1
        self.epoch: float | None = state.get("epoch")  # the epoch a header line opened
        self.epochs: float | None = state.get("epochs")  # how many epochs, when a line said
        self.section: str | None = None
        self.last: str = ""

    def state(self) -> dict:
        return {"base": self.base, "epoch": self.epoch, "epochs": self.epochs}

    def events(self, line: str):
        """One event per update of ``line`` (``\\r``, Keras's backspaces) that holds a metric, in order."""
        line = plain(line)
        if "\b" in line:
            line = re.sub("\b+", "\r", line)
        for piece in line.split("\r") if "\r" in line else (line,):
            found = self.read(piece)
            if found:
                yield found

    def read(self, text: str) -> Event | None:
        """The metrics of one update of a line (colour codes removed), None when it holds none."""
        if self.section is not None and not _FIELD.match(text):
            self.section = None
        if "*****" in text:
            self.section = section(text)
            return None
        stripped = text.strip()
        if not stripped or stripped.startswith(("[orch]", "orch:")):
            return None
        known = framework(text)
        if known is not None:
            return known or None
        brace = stripped.find("{") if stripped.endswith("}") else -1
        items = dict_items(stripped[brace:]) if brace >= 0 else None
        if items is not None:
            if not items:
                return None
            found = dict_found(items)
            kind = kind_of(stripped[:brace]) if brace else ""
        else:
            found = scan(text)
            if not found.values and not found.times:
                return None
            kind = self.section or kind_of(text, self.last)
        out = event(found, kind)
        self._counters(out, found, kind)
        if not out or set(out) <= {"t"}:
            return None
        self.last = kind
        return out

    def _counters(self, out: Event, found, kind: str) -> None:
        """The global step of a counter that restarts each epoch, the epochs and the total steps."""
        if "epoch" in out:
            if self.base is None:
                self.base = 0.0 if out["epoch"] == 0 else 1.0
            if found.epoch_total:
                self.epochs = found.epoch_total
            if len(out) == 1:  # a header ("Epoch 1/10"): the epoch of the lines that follow
                self.epoch = out["epoch"]
        if kind:  # an evaluation's or a summary's counters count its batches, not training steps
            if found.step_total:
                out.pop("step", None)
            return
        epoch = out.get("epoch", self.epoch)
        progress = None
        if found.step_total and epoch is not None and "step" in out:
            progress = (out["step"], found.step_total)  # "Epoch [1/5], Step [100/600]"
        elif found.progress is not None and "step" not in out and len(set(out) - STRUCTURAL) > 0:
            progress = found.progress
        if progress is not None:
            n, per = progress
            if epoch is not None:
                out["step"] = (epoch - (self.base if self.base is not None else 0.0)) * per + n
                if self.epochs:
                    out["total_steps"] = self.epochs * per
            else:
                out["step"], out["total_steps"] = n, per
        elif found.step_total and "step" in out:
            out["total_steps"] = found.step_total


def parse(line: str, reader: Reader | None = None) -> dict[str, float]:
    """The step, loss, eval loss and throughputs (``tok_s``, ``steps_s``, ``samples_s``) a line gives; nothing for
    other lines and for orch's own. ``reader`` carries what the lines before said (a new one when not given).

    >>> parse("step=120 loss=2.3125 tok/s=11873 epoch=0")
    {'step': 120.0, 'loss': 2.3125, 'tok_s': 11873.0}
    """
    out: dict[str, float] = {}
    for found in (reader or Reader()).events(line):
        out.update((k, v) for k, v in found.items() if k in AGENT_KEYS)
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
