"""A chunk of a log's events as the reader gives them: columns where lines of one template gave them (stdlib, no I/O).

A log prints the same few lines again and again, so most of a chunk's events are rows of a few ``Group``\\ s: the
lines of one template (``metric_templates.Batch``), their numbers a list per metric name, made in bulk, with no
dict per line. The rest (a line read on its own: an epoch header, a progress bar, a line of a template seen for the
first time) are ``singles``, one event each. ``events`` gives the dicts in the log's order, for the callers that
want them; the series writer (``agent/run/series.py``) takes the columns as they are::

    step=120 loss=2.3125      Group(names=("step", "loss"), lines=[0, 2], columns=[[120, 121], [2.3125, 2.3101]])
    Epoch 2/10           ->   singles=[(1, {"epoch": 2.0, ...})]
    step=121 loss=2.3101
"""

from __future__ import annotations

from itertools import repeat

from .metric_shapes import Event


class Group:
    """The events of a chunk's lines of one template: ``lines`` (their indices in the log read, ascending) and
    ``columns`` (a list per name in ``names``, a value per line; ints where ``ints`` says, else floats)."""

    __slots__ = ("names", "lines", "columns", "ints")

    def __init__(self, names: tuple, lines: list[int], columns: list[list], ints: tuple) -> None:
        self.names, self.lines, self.columns, self.ints = names, lines, columns, ints

    def events(self) -> list[Event]:
        """Each line's event, a dict of floats with the keys in ``names``' order."""
        floats = [map(float, column) if whole else column for column, whole in zip(self.columns, self.ints)]
        return list(map(dict, map(zip, repeat(self.names), zip(*floats))))


class Table:
    """The events of a chunk of lines: ``groups`` and ``singles`` (``(line index, event)``, in order; a line may
    give several, one per ``\\r`` update). ``first``/``end``: the indices of the chunk's first line and the one past
    its last."""

    __slots__ = ("first", "end", "groups", "singles")

    def __init__(self, first: int, end: int, groups: list[Group], singles: list[tuple[int, Event]]) -> None:
        self.first, self.end, self.groups, self.singles = first, end, groups, singles

    def _slots(self) -> tuple[list, bool]:
        """A slot per line of the chunk holding its event (None: no event), and whether some line gave several (its
        slot then holds the list of them)."""
        first = self.first
        slots: list = [None] * (self.end - first)
        put = slots.__setitem__
        for group in self.groups:
            for _ in map(put, [i - first for i in group.lines], group.events()):
                pass
        several = False
        for i, found in self.singles:
            held = slots[i - first]
            if held is None:
                slots[i - first] = found
            else:
                several = True
                slots[i - first] = [*held, found] if held.__class__ is list else [held, found]
        return slots, several

    def events(self) -> list[Event]:
        """Every event of the chunk, in the log's order."""
        if not self.groups:
            return [found for _, found in self.singles]
        if not self.singles and len(self.groups) == 1:
            return self.groups[0].events()
        slots, several = self._slots()
        if not several:
            return list(filter(None, slots))
        return [found for held in slots if held for found in (held if held.__class__ is list else (held,))]

    def placed(self) -> list[tuple[int, Event]]:
        """``events``, each with the index of the line it came from."""
        if not self.groups:
            return list(self.singles)
        slots, _ = self._slots()
        return [(i, found) for i, held in enumerate(slots, self.first) if held
                for found in (held if held.__class__ is list else (held,))]
