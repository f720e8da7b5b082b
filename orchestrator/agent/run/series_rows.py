"""How the series writer (``series.py``) turns a chunk of the reader's events into records and its summary.

The reader gives a chunk's events as columns where lines of one template gave them (``metric_lines.Reader.tables``):
a group's records are made a column at a time (each value as the series keeps it: a whole number as an int, made
text by ``repr``, which is what ``json`` writes for an int and a finite float) and the summary takes each column's
last, lowest and highest value in C. A chunk with something the columns cannot say the same way (an event of a
progress bar's counters alone, which the summary may pass over; a value not finite; an event already in the file
after a restart) is written an event at a time, as before.
"""

from __future__ import annotations

import json
import math
from itertools import repeat

MAX_KEYS = 64  # metric names the summary keeps (a log printing more keeps the first ones, as the controller does)
BAR_KEYS = {"step", "total_steps", "steps_s"}  # all a progress bar's event holds
WHOLE = 1e15  # a whole number below this is kept as an int (120, not 120.0)

_dumps = json.JSONEncoder(separators=(",", ":")).encode


def compact(event: dict) -> dict:
    """``event`` as the series keeps it: a whole number as an int."""
    return {k: int(v) if v.is_integer() and abs(v) < WHOLE else v for k, v in event.items()}


def compact_column(column: list, ints: bool) -> list | None:
    """A column as ``compact`` keeps its values; None where one is not finite (its events go one at a time)."""
    if ints:
        if -WHOLE < min(column) and max(column) < WHOLE:
            return column
        return [v if abs(v) < WHOLE else float(v) for v in column]
    if not math.isfinite(sum(column)):  # (a sum past the largest float too: those go one at a time, alike)
        return None
    if not any(map(float.is_integer, column)):
        return column
    return [int(v) if v.is_integer() and abs(v) < WHOLE else v for v in column]


class Summary:
    """What the series holds to the log offset of the state it is saved in: its events, the last step (a Hugging
    Face evaluation bar, over fewer items than the training bar and behind it, is no training step), and each
    metric's last, lowest and highest value; updated by every event read from the log, appended or not, so a
    supervisor started again from its state's offset counts each event once."""

    def __init__(self, saved: dict | None) -> None:
        saved = saved if isinstance(saved, dict) else {}
        self.events = int(saved.get("events", 0))
        self.step = saved.get("step")
        self.total_steps = saved.get("total_steps")
        self.last, self.low, self.high = (dict(saved.get(k) or {}) for k in ("last", "min", "max"))

    def add(self, event: dict) -> None:
        total = event.get("total_steps")
        if (total is not None and self.total_steps is not None and total < self.total_steps
                and set(event) <= BAR_KEYS and event.get("step", -1.0) <= (self.step or 0)):
            return
        self.events += 1
        if "step" in event:
            self.step = event["step"]
        if total is not None:
            self.total_steps = total
        for key, value in event.items():
            if key not in self.last and len(self.last) >= MAX_KEYS:
                continue
            self.last[key] = value
            self.low[key] = min(value, self.low.get(key, value))
            self.high[key] = max(value, self.high.get(key, value))

    def add_parts(self, parts: list[tuple]) -> None:
        """``add`` of every event of ``parts`` in the log's order, a part at a time: each part ``(first, last,
        names, count, lasts, lows, highs)``, its events' order from ``first`` to ``last`` (comparable keys), their
        names, how many, and each name's last, lowest and highest value. None of the events is a progress bar's
        alone with a total (``add`` may pass over such an event, as it goes)."""
        self.events += sum(part[3] for part in parts)
        latest = sorted(parts, key=lambda part: part[1])
        for part in latest:
            names = part[2]
            if "step" in names:
                self.step = part[4][names.index("step")]
            if "total_steps" in names:
                self.total_steps = part[4][names.index("total_steps")]
        last, low, high = self.last, self.low, self.high
        for part in sorted(parts, key=lambda part: part[0]):  # names new to the summary, kept in the order met
            for key, lowest, highest in zip(part[2], part[5], part[6]):
                if key in last:
                    low[key] = min(lowest, low[key])
                    high[key] = max(highest, high[key])
                elif len(last) < MAX_KEYS:
                    last[key], low[key], high[key] = None, lowest, highest
        for part in latest:
            for key, value in zip(part[2], part[4]):
                if key in last:
                    last[key] = value

    def saved(self) -> dict:
        return {"events": self.events, "step": self.step, "total_steps": self.total_steps, "last": self.last,
                "min": self.low, "max": self.high}


class Rows:
    """The records of the events a read gives, and the summary they update: ``add`` a chunk at a time, ``text``
    the records at the end. ``ends``: each line's end in the log; ``shapes``: the shapes written so far."""

    def __init__(self, ends: list[int], shapes: dict, summary: Summary) -> None:
        self.ends, self.shapes, self.summary = ends, shapes, summary
        self.slots: list = [None] * len(ends)  # each line's records, as text

    def text(self) -> str:
        return "\n".join(filter(None, self.slots))

    def columns(self, table) -> bool:
        """``add`` a chunk's events as columns; False (nothing done) where it must go an event at a time."""
        if any(total_bar(names) for names in (tuple(found) for _, found in table.singles)):
            return False
        parts, groups, ends = [], [], self.ends
        for group in table.groups:
            if total_bar(group.names):
                return False
            columns = [compact_column(column, ints) for column, ints in zip(group.columns, group.ints)]
            if None in columns:
                return False
            groups.append((group, columns))
            parts.append(((group.lines[0], 0), (group.lines[-1], 0), group.names, len(group.lines),
                          [column[-1] for column in columns], list(map(min, columns)), list(map(max, columns))))
        singles = [(i, compact(found)) for i, found in table.singles]
        for sub, (i, found) in enumerate(singles, 1):
            values = list(found.values())
            parts.append(((i, sub), (i, sub), tuple(found), 1, values, values, values))
        self.summary.add_parts(parts)
        # shapes new to the file, numbered in the order of their first event, each defined just before it
        shapes, defined = self.shapes, {}
        for first, _, names, *_ in sorted(parts, key=lambda part: part[0]):
            if names not in shapes:
                shapes[names] = len(shapes)
                defined[first] = _dumps({"id": shapes[names], "names": names}) + "\n"
        put, slots = self.slots.__setitem__, self.slots
        for group, columns in groups:
            texts = [[repr(column[0])] * len(column) if column.count(column[0]) == len(column)
                     else list(map(repr, column)) for column in columns]  # (a learning rate, an epoch: made text once)
            rows = map("[{},{},{}]".format, map(ends.__getitem__, group.lines), repeat(shapes[group.names]),
                       map(",".join, zip(*texts)))
            for _ in map(put, group.lines, rows):
                pass
            first = (group.lines[0], 0)
            if first in defined:
                slots[first[0]] = defined[first] + slots[first[0]]
        for sub, (i, found) in enumerate(singles, 1):
            record = defined.get((i, sub), "") + _dumps([ends[i], shapes[tuple(found)], *found.values()])
            slots[i] = record if slots[i] is None else slots[i] + "\n" + record
        return True

    def one(self, i: int, event: dict) -> None:
        """``add`` of one event of line ``i`` (written after any of its line before it)."""
        found = compact(event)
        self.summary.add(found)
        names = tuple(found)
        shape = self.shapes.get(names)
        record = ""
        if shape is None:
            shape = self.shapes[names] = len(self.shapes)
            record = _dumps({"id": shape, "names": names}) + "\n"
        record += _dumps([self.ends[i], shape, *found.values()])
        self.slots[i] = record if self.slots[i] is None else self.slots[i] + "\n" + record

    def summed(self, event: dict) -> None:
        """An event already in the file (a supervisor started again reads it again): in the summary alone."""
        self.summary.add(compact(event))


def total_bar(names) -> bool:
    """Whether an event of ``names`` is a progress bar's counters alone with a total (``Summary.add`` may pass it)."""
    return "total_steps" in names and set(names) <= BAR_KEYS
