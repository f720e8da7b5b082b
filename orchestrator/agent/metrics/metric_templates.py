"""Lines of one template read alike: the reader's fast path (stdlib only, no I/O).

A training log prints the same few lines again and again with other numbers. A line's *template* is the line
with each ASCII digit made ``0`` (``key_of``): ``step=1200 loss=2.3125`` and ``step=1300 loss=2.4011`` share
``step=0000 loss=0.0000``. The reader's patterns look at a character's class, never at which digit it is, so
lines of one template cut into the same numbers at the same places and give the same names; only the values
differ. The first line of a template is read in full (``metric_lines.Reader``), and what that read took from which
characters is kept here; the next lines of that template have their numbers sliced out of the same places,
with no pattern run at all. Digits that are part of a name (``acc1``, ``bf16``) are not numbers: a line of the
template must have the same ones there, or it is read in full.

Only the general shapes (``metric_shapes.scan``) are kept as plans; a line a framework's format or a dict reads
is marked ``FULL`` (read in full each time) and a line that can hold no metric ``NOTHING``.
"""

from __future__ import annotations

from .metric_names import RATES, STRUCTURAL
from .metric_shapes import Event

MASK = bytes.maketrans(b"123456789", b"000000000")
FULL = "full"  # read in full each time
NOTHING = "nothing"  # holds no metric, whatever its numbers
MISS = object()  # the line is not of the template after all (a name's digit differs): read it in full
KEPT_MAX = 4096  # templates kept; a log whose every line differs clears them now and then

_EVAL = ("val", "test")


class Template:
    """The plan of one template: which character spans hold which metric, as the first line's full read found."""

    __slots__ = ("checks", "puts", "times", "epoch_total", "step_total", "progress", "kind", "star", "named")

    def __init__(self, text: str, ops: list, spans: list[tuple[int, int]], kind: str, star: bool) -> None:
        covered = {i for a, b in spans for i in range(a, b)}
        # the digits of names: a line of this template has the very same ones
        self.checks = tuple((i, c) for i, c in enumerate(text) if "0" <= c <= "9" and i not in covered)
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

    def read(self, text: str, last: str) -> tuple[Event, str, float | None, float | None, tuple | None] | object:
        """``(event, kind, epoch_total, step_total, progress)`` of a line of this template (``last``: the kind of
        the line before), or ``MISS``."""
        for i, c in self.checks:
            if text[i] != c:
                return MISS
        kind = (last if last in _EVAL else "summary") if self.star else self.kind
        out: Event = {}
        for key, a, b, comma, factor, total in self.named.get(kind) or self._named(kind):
            value = (float(text[a:b].replace(",", "")) if comma else float(text[a:b])) * factor
            if total is not None:
                whole = float(text[total[0]:total[1]])
                if whole:
                    value = value / whole
            out[key] = value
        if self.times and not kind and "steps_s" not in out:
            for a, b, comma, factor in self.times:
                value = (float(text[a:b].replace(",", "")) if comma else float(text[a:b])) * factor
                if value > 0:
                    out["steps_s"] = 1.0 / value
                    break
        epoch_total = float(text[self.epoch_total[0]:self.epoch_total[1]]) if self.epoch_total else None
        step_total = float(text[self.step_total[0]:self.step_total[1]]) if self.step_total else None
        progress = None
        for na, nb, ta, tb in self.progress:
            if int(float(text[ta:tb])) > 0:
                progress = (float(text[na:nb]), float(text[ta:tb]))
                break
        return out, kind, epoch_total, step_total, progress


KEPT: dict[bytes, Template | str] = {}


def key_of(text: str) -> bytes:
    """``text``'s template, as bytes: ``bytes.translate`` is many times faster than ``str.translate`` on text that
    is not ASCII (a progress bar's blocks), and UTF-8 keeps ASCII digits as they are."""
    return text.encode("utf-8", "surrogatepass").translate(MASK)


def keep(key: bytes, template: Template | str) -> None:
    if len(KEPT) >= KEPT_MAX:
        KEPT.clear()
    KEPT[key] = template
