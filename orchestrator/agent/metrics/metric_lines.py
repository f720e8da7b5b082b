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
from collections.abc import Iterator
from itertools import compress, repeat
from operator import eq, itemgetter, not_
from typing import Any

from . import metric_templates
from .metric_table import Group, Table
from .metric_formats import framework
from .metric_shapes import STRUCTURAL, Event, dict_found, dict_items, event, kind_of, planned, scan, section

_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
_FIELD = re.compile(r"^\s+\S+\s*[=:]")  # "  eval_loss = 0.35", a line of a Hugging Face metrics section
_BAR_COUNTS = ("step", "epoch", "total_steps", "steps_s")  # what a bar's counter shows; the rest is its postfix
_BAR_PLACE = ("step", "epoch", "total_steps")
_EVAL = ("val_", "test_")
CHUNK = 2048  # lines read together: a chunk's columns stay in the CPU's caches
AGENT_KEYS = ("step", "loss", "tok_s", "steps_s", "samples_s", "val_loss", "test_loss")


def plain(text: str) -> str:
    """``text`` without its ANSI escapes (colours, cursor moves), as people read it."""
    return _ANSI.sub("", text) if "\x1b" in text else text


class Reader:
    """Reads the lines of one log in order (``read`` one update, ``events`` a whole line); ``state`` and
    ``Reader(state)`` carry what it remembers across reads of the same log."""

    __slots__ = ("base", "epoch", "epochs", "section", "last", "bar", "fast")

    def __init__(self, state: dict | None = None, fast: bool = True) -> None:
        state = state or {}
        # fast=False reads every line in full, as the reader did before templates (the benchmark's baseline)
        self.fast = fast
        self.base: float | None = state.get("base")  # the first epoch's number: 0 or 1
        self.epoch: float | None = state.get("epoch")  # the epoch a header line opened
        self.epochs: float | None = state.get("epochs")  # how many epochs, when a line said
        self.section: str | None = None
        self.last: str = ""
        self.bar: dict | None = state.get("bar")  # a tqdm bar's last event and update (``_bar``)

    def state(self) -> dict:
        return {"base": self.base, "epoch": self.epoch, "epochs": self.epochs, "bar": self.bar}

    def events(self, line: str):
        """One event per update of ``line`` (``\\r``, Keras's backspaces) that holds a metric, in order."""
        line = plain(line)
        if "\b" in line:
            line = re.sub("\b+", "\r", line)
        for piece in line.split("\r") if "\r" in line else (line,):
            found = self.read(piece)
            if found:
                yield found

    def lines(self, lines) -> list[Event]:
        """``events`` of each of ``lines``, in order, read a chunk at a time (``tables``)."""
        lines = lines if isinstance(lines, list) else list(lines)
        if not self.fast:
            out: list[Event] = []
            for line in lines:
                out.extend(self.events(line))
            return out
        if len(lines) <= CHUNK:
            return self._table(lines, 0).events()
        return [found for table in self.tables(lines) for found in table.events()]

    def placed(self, lines: list[str]) -> list[tuple[int, Event]]:
        """``lines``'s events as ``lines`` reads them, each with the index of the line it came from."""
        if not self.fast:
            return [(i, event) for i, line in enumerate(lines) for event in self.events(line)]
        return [placed for table in self.tables(lines) for placed in table.placed()]

    def tables(self, lines: list[str]) -> Iterator[Table]:
        """The events of ``lines`` a chunk at a time, as columns where lines of one template gave them
        (``metric_table``; the series writer takes them so, with no dict per line)."""
        for at in range(0, len(lines), CHUNK):
            yield self._table(lines[at:at + CHUNK], at)

    def _table(self, lines: list[str], first: int) -> Table:
        """The events of ``lines`` (``first``: the index of the first). Every line's template in one call
        (``metric_templates.keys``), then the lines of each template read in batch (``Batch``) found in C, and
        read a template at a time; a line that holds nothing is passed over; the rest (``odd``) are read one at a
        time in order, the kind of the batch line before each made the reader's ``last`` as reading each line in
        turn would. Where an odd line leaves the reader where a batch would read otherwise (an epoch header, an
        evaluation section), the lines after it are read as ``_chunk`` reads them."""
        n = len(lines)
        keys = metric_templates.keys(lines)
        plans = list(map(metric_templates.FAST.get, keys))
        nothing = metric_templates.NOTHING
        placed: dict[Any, list[int]] = {plan: [] for plan in set(plans)}  # each plan's lines, one C pass
        deque(map(list.append, map(placed.__getitem__, plans), range(n)), 0)
        found: list[tuple[Any, list[int], list]] = []
        odd = placed.get(None, [])
        for batch, at in placed.items():
            if batch is None or batch is nothing:
                continue
            if batch.check is not None:  # a name's digits differ from the template's: read in full
                good = list(map(eq, map(batch.check, map(lines.__getitem__, at)), repeat(batch.want)))
                if not all(good):
                    odd = odd + list(compress(at, map(not_, good)))
                    at = list(compress(at, good))
            columns = batch.columns(list(map(lines.__getitem__, at)), zero_totals=True) if at else None
            if columns is None:  # a JSON line not of its plan after all: each read on its own
                odd = odd + at
                continue
            found.append((batch, at, columns))
        if odd is not placed.get(None):
            odd.sort()
            for i in odd:
                plans[i] = None
        base = any(batch.epoch for batch, _, _ in found)
        flat = any(batch.steps for batch, _, _ in found)
        singles: list[tuple[int, Event]] = []
        end = n if self._batch_reads(base, flat) else 0
        if end:
            before = -1
            for i in odd:
                self._last_of(plans, before, i)
                self._one(lines[i], keys[i], first + i, singles)
                before = i
                if not self._batch_reads(base, flat):
                    end = i + 1
                    break
            else:
                self._last_of(plans, before, n)
        groups, mixed = [], False
        for batch, at, columns in found:
            if end < n:
                cut = bisect.bisect_left(at, end)
                at, columns = at[:cut], [column[:cut] for column in columns]
            if not at:
                continue
            group = Group(batch.names, [first + i for i in at], columns, batch.ints)
            if batch.steps and 0 in columns[-1]:
                for i, one in zip(group.lines, group.events()):  # a total of 0 is no total (``_counters``)
                    if not one["total_steps"]:
                        del one["total_steps"]
                    singles.append((i, one))
                mixed = True
            else:
                groups.append(group)
        if end < n:
            slots, where = self._chunk(lines[end:], first + end)
            singles.extend((i, one) for i, one in zip(where, slots) if one)
        if mixed:
            singles.sort(key=itemgetter(0))  # (stable: a line's updates stay in their order)
        return Table(first, first + n, groups, singles)

    def _batch_reads(self, base: bool, flat: bool) -> bool:
        """Whether a batch line reads now as it would read on its own (``_chunk``'s test, for the chunk's batches)."""
        return self.section is None and (self.base is not None or not base) and (self.epoch is None or not flat)

    def _last_of(self, plans: list, before: int, at: int) -> None:
        """The reader's ``last`` as the batch lines between ``before`` and ``at`` leave it: the last one's kind."""
        nothing = metric_templates.NOTHING
        for i in range(at - 1, before, -1):
            plan = plans[i]
            if plan is not None and plan is not nothing:
                self.last = plan.kind
                return

    def _one(self, line: str, key: bytes, i: int, out: list[tuple[int, Event]]) -> None:
        """The events of one line read on its own, as ``_chunk`` reads a line that is no batch's, put in ``out``."""
        plan = metric_templates.KEPT.get(key)
        if plan is metric_templates.NOTHING:
            return
        if plan.__class__ is metric_templates.JsonPlan:
            found = plan.read(line)
            found = self.read(line) if found is metric_templates.MISS else self._event(found, "", None, None, None)
            if found:
                out.append((i, found))
        elif "\x1b" in line or "\r" in line or "\b" in line:
            out.extend((i, found) for found in self.events(line))
        elif (found := self.read(line)):
            out.append((i, found))

    def _chunk(self, lines: list[str], first: int) -> tuple[list[Event | None], list[int]]:
        """The events of ``lines`` in order (None where a line read with others gave none) and the index of the line
        each came from (``first`` the first's)."""
        kept = metric_templates.KEPT.get  # (``keep`` clears that dict in place: the bound method stays good)
        nothing, miss = metric_templates.NOTHING, metric_templates.MISS
        template, json_plan = metric_templates.Template, metric_templates.JsonPlan
        slots: list[Event | None] = []
        where: list[int] = []  # the index of each slot's line
        append, place, read, events = slots.append, where.append, self.read, self.events
        batches: dict[metric_templates.Batch, tuple[list[int], list[str]]] = {}
        for i, (line, key) in enumerate(zip(lines, metric_templates.keys(lines)), first):
            plan = kept(key)  # (None for a line with colour codes, \r or \b: its pieces' templates are kept)
            if plan is nothing:
                continue
            cls = plan.__class__
            if cls is template and self.section is None:
                batch = plan.batch
                if (batch is not None and (batch.check is None or batch.check(line) == batch.want)
                        and (self.base is not None or not batch.epoch) and (self.epoch is None or not batch.steps)):
                    noted = batches.get(batch)
                    if noted is None:
                        noted = batches[batch] = ([], [])
                    noted[0].append(len(slots))
                    noted[1].append(line)
                    append(None)
                    place(i)
                    self.last = batch.kind
                    continue
            elif cls is json_plan:
                found = plan.read(line)
                found = read(line) if found is miss else self._event(found, "", None, None, None)
                if found:
                    append(found)
                    place(i)
                continue
            if "\x1b" in line or "\r" in line or "\b" in line:
                for found in events(line):
                    append(found)
                    place(i)
            elif (found := read(line)):
                append(found)
                place(i)
        put = slots.__setitem__
        for batch, (places, texts) in batches.items():
            for _ in map(put, places, batch.events(texts)):
                pass
        return slots, where

    def read(self, text: str) -> Event | None:
        """The metrics of one update of a line (colour codes removed), None when it holds none."""
        if self.section is not None or not self.fast:
            return self._read(text, None)
        key = metric_templates.key_of(text)
        kept = metric_templates.KEPT.get(key)
        if kept is None:
            return self._read(text, key)
        if kept is metric_templates.NOTHING:
            return None
        if kept is metric_templates.FULL:
            return self._read(text, None)
        if kept.__class__ is metric_templates.JsonPlan:
            found = kept.read(text)
            if found is metric_templates.MISS:
                return self._read(text, None)
            return self._event(found, "", None, None, None)
        got = kept.read(text, self.last)
        if got is metric_templates.MISS:
            return self._read(text, None)
        out, kind, epoch_total, step_total, progress = got
        return self._event(out, kind, epoch_total, step_total, progress)

    def _read(self, text: str, key: bytes | None) -> Event | None:
        """``read`` in full; ``key``: the line's template, kept with how the line was read (None: keep nothing)."""
        if self.section is not None and not _FIELD.match(text):
            self.section = None
        keep = metric_templates.keep if key is not None else _forget
        if "*****" in text:
            self.section = section(text)
            keep(key, metric_templates.FULL)
            return None
        stripped = text.strip()
        if not stripped or stripped.startswith(("[orch]", "orch:")):
            keep(key, metric_templates.NOTHING)
            return None
        known = framework(text)
        if known is not None:
            keep(key, metric_templates.FULL if known else metric_templates.NOTHING)
            if known and "%|" in text:
                return self._bar(known)
            return known or None
        brace = stripped.find("{") if stripped.endswith("}") else -1
        items = dict_items(stripped[brace:]) if brace >= 0 else None
        if items is not None:
            found = dict_found(items)
            kind = kind_of(stripped[:brace]) if brace else ""
            plan = metric_templates.json_plan(text) if key is not None and text.startswith('{"') else None
            # kept only where it reads this very line as the full read does: a line of its template then reads alike
            keep(key, plan if plan is not None and plan.read(text) == event(found, kind) else metric_templates.FULL)
            if not items:
                return None
        else:
            if key is None:
                found = scan(text)
            else:
                found, ops, spans = planned(text)
                if ops is None:
                    keep(key, metric_templates.FULL)
                elif not ops:
                    keep(key, metric_templates.NOTHING)
                else:  # a kind that depends on the line before (ImageNet's " * Acc@1") is found per line
                    kind = kind_of(text)
                    keep(key, metric_templates.Template(text, ops, spans, kind, kind != kind_of(text, "val")))
            if not found.values and not found.times:
                return None
            kind = self.section or kind_of(text, self.last)
        return self._event(event(found, kind), kind, found.epoch_total, found.step_total, found.progress)

    def _bar(self, update: Event) -> Event | None:
        """A tqdm bar's update as the step's event, None for a redraw that shows nothing new.

        A bar whose postfix is set each step (Lightning's ``train_loss=…``) prints twice per step: tqdm redraws the
        new count with the old postfix, then ``set_postfix`` redraws it with the new one. Only the second is the
        step's; the first would put the previous step's loss at this step::

            Epoch 0:  10%|█  | 2/20 [00:00<00:00, 266.20it/s, train_loss=1.440]   <- held: step 1's loss
            Epoch 0:  10%|█  | 2/20 [00:00<00:00, 256.75it/s, train_loss=0.731]   <- step 2's event

        So an update whose postfix is the last event's is held (the next one of its step is the event, even with an
        equal postfix), and a redraw at the step of the last event (Lightning's after a validation) gives only what
        changed (``val_loss``); an evaluation's metric still shown at later steps is left out of their events. A bar
        without a postfix is an event at each update, as before.
        """
        step = update.get("step")
        shown = {k: v for k, v in update.items() if k not in _BAR_COUNTS}
        bar = self.bar or {}
        last = bar.get("shown")
        moved = bar.get("held") and step is not None and step == bar.get("seen") != bar.get("step")
        if shown and not moved:  # (moved: the update after a held one that moved the counter is the step's)
            if shown == last:
                self.bar = {**bar, "seen": step, "held": True}
                return None
            if last is not None and step == bar.get("step"):
                update = {k: v for k, v in update.items() if k in _BAR_PLACE or (k in shown and last.get(k) != v)}
        if last:  # an evaluation's metric the postfix keeps showing is that evaluation's, not a new one
            update = {k: v for k, v in update.items() if not (k.startswith(_EVAL) and last.get(k) == v)}
        self.bar = {"step": step, "shown": shown, "seen": step, "held": False}
        return update

    def _event(self, out: Event, kind: str, epoch_total: float | None, step_total: float | None,
               progress: tuple[float, float] | None) -> Event | None:
        self._counters(out, kind, epoch_total, step_total, progress)
        if not out or (len(out) == 1 and "t" in out):
            return None
        self.last = kind
        return out

    def _counters(self, out: Event, kind: str, epoch_total: float | None, step_total: float | None,
                  found_progress: tuple[float, float] | None) -> None:
        """The global step of a counter that restarts each epoch, the epochs and the total steps."""
        if "epoch" in out:
            if self.base is None:
                self.base = 0.0 if out["epoch"] == 0 else 1.0
            if epoch_total:
                self.epochs = epoch_total
            if len(out) == 1:  # a header ("Epoch 1/10"): the epoch of the lines that follow
                self.epoch = out["epoch"]
        if kind:  # an evaluation's or a summary's counters count its batches, not training steps
            if step_total:
                out.pop("step", None)
            return
        epoch = out.get("epoch", self.epoch)
        progress = None
        if step_total and epoch is not None and "step" in out:
            progress = (out["step"], step_total)  # "Epoch [1/5], Step [100/600]"
        elif found_progress is not None and "step" not in out and len(set(out) - STRUCTURAL) > 0:
            progress = found_progress
        if progress is not None:
            n, per = progress
            if epoch is not None:
                out["step"] = (epoch - (self.base if self.base is not None else 0.0)) * per + n
                if self.epochs:
                    out["total_steps"] = self.epochs * per
            else:
                out["step"], out["total_steps"] = n, per
        elif step_total and "step" in out:
            out["total_steps"] = step_total


def _forget(key: bytes | None, template: object) -> None:
    """Keeps nothing: a line read in full whose template is already known, or read inside a section."""


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
