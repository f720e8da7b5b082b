"""Lines of one template read alike: the reader's fast path (stdlib only, no I/O).

A training log prints the same few lines again and again with other numbers. A line's *template* is the line
with each ASCII digit made ``0`` (``key_of``): ``step=1200 loss=2.3125`` and ``step=1300 loss=2.4011`` share
``step=0000 loss=0.0000``. The reader's patterns look at a character's class, never at which digit it is, so
lines of one template cut into the same numbers at the same places and give the same names; only the values
differ. The first line of a template is read in full (``metric_lines.Reader``), and what that read took from which
characters is kept here; the next lines of that template have their numbers sliced out of the same places,
with no pattern run at all. Digits that are part of a name (``acc1``, ``bf16``) are not numbers: a line of the
template must have the same ones there, or it is read in full.

Only the general shapes (``metric_shapes.scan``) and flat JSON objects of numbers (``JsonPlan``) are kept as
plans; a line a framework's format or another dict reads is marked ``FULL`` (read in full each time) and a line
that can hold no metric ``NOTHING``. ``Reader.lines`` reads a chunk of lines at a time, and the lines of a template
that needs nothing from the lines before it together (``Batch``): a column of numbers at a time, in C.
"""

from __future__ import annotations

import json
import re
from itertools import repeat
from operator import itemgetter, mul

from .metric_names import RATES, STRUCTURAL, name_of
from .metric_shapes import JSON_TIME_KEYS, Event
from .metric_table import Group

MASK = bytes.maketrans(b"123456789", b"000000000")
FULL = "full"  # read in full each time
NOTHING = "nothing"  # holds no metric, whatever its numbers
MISS = object()  # the line is not of the template after all (a name's digit differs): read it in full
KEPT_MAX = 4096  # templates kept; a log whose every line differs clears them now and then

_EVAL = ("val", "test")


class Template:
    """The plan of one template: which character spans hold which metric, as the first line's full read found."""

    __slots__ = ("checks", "puts", "times", "epoch_total", "step_total", "progress", "kind", "star", "named",
                 "check", "want", "quick", "sliced", "batch", "text")

    def __init__(self, text: str, ops: list, spans: list[tuple[int, int]], kind: str, star: bool) -> None:
        self.text = text
        self.checks, self.check, self.want = _checks(text, spans)
        self.kind, self.star = kind, star
        self.times: list[tuple[int, int, float, bool]] = []
        self.epoch_total: tuple[int, int] | None = None
        self.step_total: tuple[int, int] | None = None
        self.progress: list[tuple[int, int, int, int]] = []
        # Found.put, played once here: a key's place is its first put, its value the last strong put's (else first)
        first: dict[tuple[str, str], int] = {}
        wins: dict[tuple[str, str], tuple] = {}
        strong: set[tuple[str, str]] = set()

        def span(i: int) -> tuple[int, int, bool]:
            a, b = spans[i]
            return a, b, "," in text[a:b]

        for op in ops:
            if op[0] == "put":
                _, split, name, factor, weak, i, total = op
                key = (split, name)
                if key in wins and (weak or key in strong):
                    continue
                first.setdefault(key, len(first))
                wins[key] = (split, name, *span(i), factor, spans[total] if total is not None else None)
                if not weak:
                    strong.add(key)
            elif op[0] == "time":
                self.times.append((*span(op[2]), op[1]))
            elif op[0] == "epoch_total":
                self.epoch_total = spans[op[1]]
            elif op[0] == "step_total":
                self.step_total = spans[op[1]]
            elif op[0] == "progress":
                self.progress.append((*spans[op[1]], *spans[op[2]]))
        self.puts = [wins[key] for key in sorted(first, key=first.__getitem__)]
        self.named: dict[str, list[tuple]] = {}
        self.sliced: dict[str, tuple | None] = {}
        # a line of a quick template is its sliced numbers and its totals: no kind from the line before, no rate
        # from a time, no bare progress counter (``Reader.lines`` reads it without the per-line bookkeeping)
        self.quick = not (star or self.times or self.progress)
        self.batch = Batch.of(self, kind) if self.quick and not self.epoch_total else None

    def _named(self, kind: str) -> list[tuple]:
        """The puts with the names ``metric_shapes.event`` gives them on a line of ``kind``."""
        out = []
        for split, name, a, b, comma, factor, total in self.puts:
            if name in STRUCTURAL:
                key = name
            else:
                split = split or (kind if kind in _EVAL else "")
                if split or kind == "summary":
                    if name in RATES:
                        continue  # an evaluation's or a summary's rate is not the training's
                    key = f"{split or kind}_{name}"
                else:
                    key = name
            out.append((key, a, b, comma, factor, total))
        self.named[kind] = out
        return out

    def _sliced(self, kind: str) -> tuple | None:
        """``kind``'s puts as one slicing: ``(names, getter of every number's text, fix-ups)``, a fix-up being
        ``(index, factor, total span)`` of a number scaled or divided; None where a number has a thousands comma
        (read one by one)."""
        named = self.named.get(kind) or self._named(kind)
        if any(comma for _, _, _, comma, _, _ in named):
            self.sliced[kind] = None
            return None
        names = tuple(key for key, *_ in named)
        spans = [slice(a, b) for _, a, b, _, _, _ in named] or [slice(0, 0)]
        get = itemgetter(*(spans * 2 if len(spans) == 1 else spans))  # (a tuple either way; zip stops at names)
        fix = tuple((j, factor, total) for j, (_, _, _, _, factor, total) in enumerate(named)
                    if factor != 1.0 or total is not None)
        self.sliced[kind] = found = (names, get, fix)
        return found

    def slice(self, text: str, kind: str) -> Event | object:
        """The metrics of a line of this template, read as ``kind``, or ``MISS``: its numbers cut out in one call
        and made floats in one ``map``."""
        if self.check is not None and self.check(text) != self.want:
            return MISS
        sliced = self.sliced[kind] if kind in self.sliced else self._sliced(kind)
        if sliced is None:
            return self._values(text, kind)
        names, get, fix = sliced
        if not names:
            return {}
        if not fix:
            return dict(zip(names, map(float, get(text))))
        values = list(map(float, get(text)))
        for j, factor, total in fix:
            value = values[j] * factor
            if total is not None:
                whole = float(text[total[0]:total[1]])
                if whole:
                    value = value / whole
            values[j] = value
        return dict(zip(names, values))

    def totals(self, text: str) -> tuple[float | None, float | None]:
        """The line's number of epochs and of steps, where the template's first line gave them."""
        epochs, steps = self.epoch_total, self.step_total
        return (float(text[epochs[0]:epochs[1]]) if epochs else None,
                float(text[steps[0]:steps[1]]) if steps else None)

    def _values(self, text: str, kind: str) -> Event:
        out: Event = {}
        for key, a, b, comma, factor, total in self.named.get(kind) or self._named(kind):
            value = (float(text[a:b].replace(",", "")) if comma else float(text[a:b])) * factor
            if total is not None:
                whole = float(text[total[0]:total[1]])
                if whole:
                    value = value / whole
            out[key] = value
        return out

    def read(self, text: str, last: str) -> tuple[Event, str, float | None, float | None, tuple | None] | object:
        """``(event, kind, epoch_total, step_total, progress)`` of a line of this template (``last``: the kind of
        the line before), or ``MISS``."""
        kind = (last if last in _EVAL else "summary") if self.star else self.kind
        out = self.slice(text, kind)
        if out is MISS:
            return MISS
        if self.times and not kind and "steps_s" not in out:
            for a, b, comma, factor in self.times:
                value = (float(text[a:b].replace(",", "")) if comma else float(text[a:b])) * factor
                if value > 0:
                    out["steps_s"] = 1.0 / value
                    break
        epoch_total, step_total = self.totals(text)
        progress = None
        for na, nb, ta, tb in self.progress:
            if int(float(text[ta:tb])) > 0:
                progress = (float(text[na:nb]), float(text[ta:tb]))
                break
        return out, kind, epoch_total, step_total, progress


def _checks(text: str, spans) -> tuple[tuple, itemgetter | None, tuple]:
    """The digits of ``text`` outside ``spans`` (a name's: a line of its template has the very same ones), and the
    same check in one C call: a getter of those characters and what it must give (a single index twice, as
    itemgetter of one index gives the item, not a tuple)."""
    covered = {i for a, b in spans for i in range(a, b)}
    checks = tuple((i, c) for i, c in enumerate(text) if "0" <= c <= "9" and i not in covered)
    at = [i for i, _ in checks] or [0]
    at = at * 2 if len(at) == 1 else at
    return checks, (itemgetter(*at) if checks else None), tuple(text[i] for i in at)


class Batch:
    """How ``Reader.lines`` reads a chunk's lines of one template together, with no Python step per line: their
    numbers cut out (``cuts``, one a number) and made numbers a column at a time (``columns``), in C. Only for a
    template whose line needs nothing from the lines before it but what ``Reader.lines`` checks as it goes
    (``epoch``: the first epoch's number is known; ``steps``: no epoch header is open, and the line's step total
    becomes ``total_steps``, as ``Reader._counters`` makes it). A JSON line's template (``JsonPlan``) is read alike,
    its values cut out where its first line has them (``strict``: as JSON reads them, so a number with a leading 0 is
    no JSON number: such lines are read one at a time)."""

    __slots__ = ("names", "spans", "cuts", "factors", "whole", "ints", "epoch", "steps", "kind", "check", "want",
                 "repeats", "strict")

    def __init__(self, names: tuple, text: str, at: list[tuple[int, int]], factors: tuple, steps: bool, kind: str,
                 strict: bool = False) -> None:
        self.names, self.factors, self.epoch, self.steps = names, factors, "epoch" in names, steps
        self.spans = tuple(at)
        self.cuts = tuple(itemgetter(slice(a, b)) for a, b in at)
        # a number printed as digits alone (every line of the template has ASCII digits where its first line has
        # them) is made an int: twice as fast as a float, and whole as the series keeps it
        self.whole = tuple(text[a:b].isascii() and text[a:b].isdigit() for a, b in at)
        self.ints = tuple(w and f == 1.0 for w, f in zip(self.whole, factors))  # the columns given as ints
        # (a JSON number's first digit, where it has more than one before its point: a 0 there is no JSON)
        self.strict = tuple(_lead(text[a:b]) for a, b in at) if strict else None
        self.kind = kind
        self.check, self.want = None, ()
        self.repeats = [True] * len(names)  # whether a column's numbers are worth a look for repeats

    @classmethod
    def of(cls, template: Template, kind: str) -> Batch | None:
        named = template.named.get(kind) or template._named(kind)
        names = tuple(key for key, *_ in named)
        if not names or names == ("t",) or names == ("epoch",):
            return None  # a line that may give no event, or an epoch header
        if any(comma or total is not None for _, _, _, comma, _, total in named):
            return None  # a thousands comma or a count out of a total: read one line at a time
        at = [(a, b) for _, a, b, _, _, _ in named]
        factors = tuple(factor for *_, factor, _ in named)
        steps = template.step_total is not None
        if steps:
            if kind or "epoch" in names or "step" not in names:
                return None  # the step total moves the step or goes: ``Reader._counters`` does it
            names, at, factors = (*names, "total_steps"), at + [template.step_total], (*factors, 1.0)
        batch = cls(names, template.text, at, factors, steps, kind)
        batch.check, batch.want = template.check, template.want
        return batch

    def columns(self, lines: list[str], zero_totals: bool = False) -> list[list] | None:
        """The numbers of ``lines`` (all of this template and checked already), a list per name: ints where
        ``ints`` says, floats elsewhere. A column of one number (a learning rate, an epoch) makes it a number once,
        and one whose numbers repeat each of its texts. None where a line's step total is 0 (no total: its event
        has no ``total_steps``, as ``Reader._counters`` makes it), unless ``zero_totals``, and where a strict
        batch's line is no JSON."""
        columns: list = []
        repeats, strict = self.repeats, self.strict
        n = len(lines)
        if not n:
            return [[] for _ in self.names]
        joined, width = None, len(lines[0])
        for j, (cut, factor, whole) in enumerate(zip(self.cuts, self.factors, self.whole)):  # (no tuple per line)
            make = int if whole else float
            if repeats[j]:
                # a column of one number, found without cutting it out of each line: the lines of a template are of
                # one length, so its every character's place, taken from all the lines at once, holds one character
                if joined is None:
                    joined = "".join(lines)
                    joined = joined if len(joined) == width * n else ""
                a, b = self.spans[j]
                if joined and all(map(_alike, (joined[i::width] for i in range(a, b)))):
                    text = lines[0][a:b]
                    if strict is not None and strict[j] is not None and text[strict[j]] == "0":
                        return None
                    values = [make(text)] * n
                    columns.append(values if factor == 1.0 else [values[0] * factor] * n)
                    continue
            texts = list(map(cut, lines))
            if strict is not None and strict[j] is not None and min(texts)[strict[j]] == "0":
                return None
            if not repeats[j]:
                values = list(map(make, texts))
            else:
                distinct = set(texts)
                if len(distinct) * 5 < n * 4:
                    made = dict(zip(distinct, map(make, distinct)))
                    values = list(map(made.__getitem__, texts))
                else:
                    if n >= 64:
                        repeats[j] = False  # a column of new numbers (a step, a loss): not looked at again
                    values = list(map(make, texts))
            columns.append(values if factor == 1.0 else list(map(mul, values, repeat(factor))))
        if self.steps and not zero_totals and 0 in columns[-1]:
            return None
        return columns

    def events(self, lines: list[str]) -> list[Event]:
        """The events of ``lines``, as ``columns`` reads them, each a dict of floats."""
        columns = self.columns(lines)
        if columns is not None:
            return Group(self.names, [], columns, self.ints).events()
        events = Group(self.names, [], self.columns(lines, True), self.ints).events()  # type: ignore[arg-type]
        for found in events:  # a total of 0 is no total (``Reader._counters``)
            if not found["total_steps"]:
                del found["total_steps"]
        return events


def _alike(chars: str) -> bool:
    return chars.count(chars[0]) == len(chars)


def _lead(number: str) -> int | None:
    """Where a JSON number's first digit is, where it has more than one digit before its point (else None)."""
    lead = 1 if number.startswith("-") else 0
    whole = len(number[lead:].split(".")[0].split("e")[0].split("E")[0])
    return lead if whole > 1 else None


class JsonPlan:
    """The plan of a JSON object line's template (a flat object of numbers, ``{"step": 12, "loss": 2.31}``): which
    of its values become which metrics, as a full read of its first line found. A line of the template is parsed
    by ``json`` (in C) and its values picked, with no name read again; a line whose keys differ (``acc1`` and
    ``acc5`` share a template) is a ``MISS``."""

    __slots__ = ("keys", "pick", "names", "scales", "batch")

    def __init__(self, keys: tuple, picks: list[tuple[int, str, float]], text: str = "") -> None:
        self.keys = keys
        self.names = tuple(name for _, name, _ in picks)
        at = [j for j, _, _ in picks]
        self.pick = itemgetter(*(at * 2 if len(at) == 1 else at)) if at else None
        scales = tuple(scale for _, _, scale in picks)
        self.scales = scales if any(scale != 1.0 for scale in scales) else None
        # (an epoch moves what the reader remembers, and an event of a time alone is none: read a line at a time)
        plain = "epoch" not in self.names and self.names not in ((), ("t",))
        spans = _json_spans(text, len(keys)) if plain else None
        self.batch = None
        if spans is not None:
            self.batch = Batch(self.names, text, [spans[j] for j in at], scales, False, "", strict=True)
            self.batch.check, self.batch.want = _checks(text, spans)[1:]  # (every value's digits may differ)

    def read(self, text: str) -> Event | object:
        try:
            obj = json.loads(text)
        except ValueError:
            return MISS
        if obj.__class__ is not dict or tuple(obj) != self.keys:
            return MISS
        if self.pick is None:
            return {}
        values = self.pick(list(obj.values()))
        if self.scales is None:
            return dict(zip(self.names, map(float, values)))
        return dict(zip(self.names, [float(v) * scale for v, scale in zip(values, self.scales)]))


_JSON_VALUE = re.compile(r'"(?:[^"\\]|\\.)*"\s*:\s*(-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)\s*[,}]')


def _json_spans(text: str, n: int) -> list[tuple[int, int]] | None:
    """Where the ``n`` values of a flat JSON object of numbers are in ``text``, each as ``json`` reads it; None
    where that is not plain."""
    spans = [m.span(1) for m in _JSON_VALUE.finditer(text)]
    if len(spans) != n:
        return None
    values = list(json.loads(text).values())
    if any(json.loads(text[a:b]) != value or value.__class__ is not json.loads(text[a:b]).__class__
           for (a, b), value in zip(spans, values)):
        return None
    return spans


def json_plan(text: str) -> JsonPlan | None:
    """The plan of a JSON object line (``metric_shapes.dict_found`` and ``event`` played on its keys), None for one
    that is not a flat object of numbers."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if obj.__class__ is not dict or not all(v.__class__ in (int, float) for v in obj.values()):
        return None
    seen: set[tuple[str, str]] = set()
    picks = []
    for j, key in enumerate(obj):
        if key.lower() in JSON_TIME_KEYS:
            split, name, scale = "", "t", 1.0
        else:
            named = name_of(key)
            if named is None or named[0] == "time":
                continue
            split, name, scale = named
        if (split, name) in seen:  # the first of a name is kept (``Found.put``)
            continue
        seen.add((split, name))
        if name in STRUCTURAL:
            picks.append((j, name, scale))
        elif not split:
            picks.append((j, name, scale))
        elif name not in RATES:
            picks.append((j, f"{split}_{name}", scale))
    return JsonPlan(tuple(obj), picks, text)


KEPT: dict[bytes, Template | JsonPlan | str] = {}
# the templates of KEPT whose lines a chunk reads together (their ``batch``), and those that hold nothing
FAST: dict[bytes, Batch | JsonBatch | str] = {}


def key_of(text: str) -> bytes:
    """``text``'s template, as bytes: ``bytes.translate`` is many times faster than ``str.translate`` on text that
    is not ASCII (a progress bar's blocks), and UTF-8 keeps ASCII digits as they are."""
    return text.encode("utf-8", "surrogatepass").translate(MASK)


def keys(lines: list[str]) -> list[bytes]:
    """``key_of`` of each of ``lines``, in one call for them all (one join, one encoding, one translation)."""
    found = "\n".join(lines).encode("utf-8", "surrogatepass").translate(MASK).split(b"\n")
    return found if len(found) == len(lines) else [key_of(line) for line in lines]  # (a line with a \n in it)


def keep(key: bytes, template: Template | JsonPlan | str) -> None:
    if len(KEPT) >= KEPT_MAX:
        KEPT.clear()
        FAST.clear()
    KEPT[key] = template
    fast = template if template is NOTHING else getattr(template, "batch", None)
    if fast is not None:
        FAST[key] = fast
    else:
        FAST.pop(key, None)
