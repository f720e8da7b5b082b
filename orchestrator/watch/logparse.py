"""Log line -> metric event on the controller: the agent's reader (``agent/metrics/metric_lines.py``, which ships to the
targets, so a run's supervisor and ``orch status`` read a line alike) plus the user's ``[metrics] patterns``.

Pure and fast: ``orch status`` parses whole logs with it. Recognised with no configuration: nanoGPT, Hugging
Face Trainer, Lightning, torchtitan and Megatron-LM lines, and the shapes any training script prints
(``key=value``, ``key: value``, ``| key value |``, meters, ``[N/M]`` counters, dicts and JSON, tqdm bars)::

    >>> Parser().parse_line("iter 10: loss 2.3456, time 5.86ms, mfu 1.23%")       # nanoGPT
    {'step': 10.0, 'loss': 2.3456, 'steps_s': 170.64846416382252, 'mfu': 1.23}
    >>> Parser().parse_line("| end of epoch   1 | time: 35.12s | valid loss  5.61 | valid ppl   273.39")
    {'epoch': 1.0, 'val_loss': 5.61, 'val_ppl': 273.39}

Evaluation metrics are ``val_<name>`` / ``test_<name>``, a summary line's ``summary_<name>`` (``metric_shapes``
says how names are made). ANSI colour codes are dropped first; a ``\\r``-separated line is one update per piece
(``parse_line`` merges them, so the last one wins). Throughput is ``tok_s`` only where the line gives tokens per
second, ``samples_s`` for samples (images, examples), and ``steps_s`` for a rate that counts steps (it/s, a time
per iteration).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping

from orchestrator.agent.metrics.metric_lines import Reader, plain
from orchestrator.agent.metrics.metric_names import name_of
from orchestrator.agent.metrics.metric_shapes import Event
from orchestrator.errors import ConfigError
from orchestrator.watch.reading_key import PARSER_VERSION, parser_key

__all__ = ["PARSER_VERSION", "Event", "Parser", "parser_key", "plain"]

class Parser:
    """Turns one log line into ``{metric: value}`` or ``None`` when the line holds no metric.

    ``patterns`` maps a metric name to a regex with exactly one group, e.g. ``{"loss": "L=([0-9.]+)"}``;
    it is matched against each update of the line with colour codes removed, and wins over the built-in formats.
    A parser reads one log in order: ``state`` (what its reader remembers, e.g. the epoch a header opened)
    carries over to a ``Parser(patterns, state)`` that reads on. ``fast=False`` reads each line in full, as orch
    did before it kept line templates (``benchmarks/bench_metrics.py`` measures against it).
    """

    def __init__(self, patterns: Mapping[str, str] | None = None, state: dict | None = None,
                 fast: bool = True) -> None:
        self._user: list[tuple[str, float, re.Pattern[str]]] = []
        for name, source in (patterns or {}).items():
            rx = _compile_pattern(name, source)
            self._user.append((*_user_name(name), rx))
        self.reader = Reader(state, fast)

    def state(self) -> dict:
        return self.reader.state()

    def parse_line(self, line: str) -> Event | None:
        """The line's metrics; with several ``\\r`` updates in it, later values win."""
        out: Event | None = None
        for event in self.events(line):
            out = event if out is None else {**out, **event}
        return out

    def events(self, line: str) -> Iterator[Event]:
        """One event per ``\\r``-separated update of ``line`` that holds a metric, in order."""
        if not self._user:
            yield from self.reader.events(line)
            return
        text = plain(line)
        for piece in text.split("\r") if "\r" in text else (text,):
            event = self._piece(piece)
            if event is not None:
                yield event

    def parse_lines(self, lines: Iterable[str]) -> list[Event]:
        """All events of ``lines``, in order, skipping lines without metrics."""
        if not self._user:
            return self.reader.lines(lines)
        out: list[Event] = []
        for line in lines:
            out.extend(self.events(line))
        return out

    def matching(self, lines: Iterable[str]) -> dict[str, int]:
        """How many of ``lines`` each user pattern matches (what a check of ``[metrics] patterns`` reports)."""
        counts = {name: 0 for name, _, _ in self._user}
        for line in lines:
            text = plain(line)
            for name, _, rx in self._user:
                m = rx.search(text)
                if m is not None and _number(m.group(1)) is not None:
                    counts[name] += 1
        return counts

    def _piece(self, text: str) -> Event | None:
        out = self.reader.read(text)
        for name, scale, rx in self._user:
            m = rx.search(text)
            if m is None:
                continue
            value = _number(m.group(1))
            if value is None:
                continue
            if out is None:
                out = {}
            out[name] = value * scale
        return out


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except (TypeError, ValueError):
        return None


def _user_name(name: str) -> tuple[str, float]:
    """The name a user pattern's metric is kept under: the reader's for a name it knows (``Ktok/s`` -> ``tok_s``,
    ``valid loss`` -> ``val_loss``), else the name as given."""
    named = name_of(name)
    if named is None or named[0] == "time":
        return name, 1.0
    split, canon, scale = named
    return (f"{split}_{canon}" if split else canon), scale


def _compile_pattern(name: str, source: object) -> re.Pattern[str]:
    where = f"[metrics] patterns.{name} in orch.toml"
    if not isinstance(source, str):
        raise ConfigError(f"metrics pattern {name!r} is not a string: {source!r}",
                          f"write {where} as a quoted regex, e.g. 'L=([0-9.]+)'")
    try:
        rx = re.compile(source)
    except re.error as exc:
        raise ConfigError(f"metrics pattern {name!r} is not a valid regex: {exc}",
                          f"fix {where} (single quotes keep backslashes literal)") from exc
    if rx.groups != 1:
        raise ConfigError(f"metrics pattern {name!r} has {rx.groups} groups, needs exactly 1",
                          f"in {where} capture only the number, e.g. 'L=([0-9.]+)'; use (?:...) elsewhere")
    return rx


_CANDIDATE = re.compile(r"(?<![\w])([A-Za-z][\w/@.-]*)(\W{0,3}?)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)")
_WANTED = ("loss", "lr", "acc", "ppl")
NUMBER_GROUP = r"([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"


def propose(lines: Iterable[str]) -> tuple[str, str, int] | None:
    """A ``[metrics] patterns`` entry built from a log's own lines, checked against them: ``(name, regex,
    lines it reads)`` for the word nearest a number among loss, lr, acc, ppl (loss first), None when no line
    has one. ``L=0.25`` gives ``("loss", "L=" + NUMBER_GROUP, n)`` only as ``loss`` is named in it, so the
    proposal never guesses which number a line's loss is."""
    sample = [plain(line) for line in lines if line.strip()][:200]
    best: tuple[int, str, str] | None = None
    for line in sample:
        for m in _CANDIDATE.finditer(line):
            word = m[1].lower()
            rank = next((i for i, w in enumerate(_WANTED) if w in word), None)
            if rank is None or (best is not None and best[0] <= rank):
                continue
            sep = m[2]
            between = r"\s*" + re.escape(sep) + r"\s*" if sep.strip() else r"\s+"
            source = re.escape(m[1]) + between + NUMBER_GROUP
            best = (rank, _WANTED[rank], source)
    if best is None:
        return None
    rx = re.compile(best[2])
    reads = sum(1 for line in sample if (m := rx.search(line)) is not None and _number(m.group(1)) is not None)
    return (best[1], best[2], reads) if reads else None
