"""A run's metric series, kept by its supervisor beside its log: ``metrics.jsonl`` in the run folder.

The supervisor reads each line its command prints (``metric_lines``, the one metric reader) and appends every
metric of each event (``loss``, ``lr``, ``val_loss``, ``test_acc1``, ``summary_loss``: train, evaluation and summary
kept apart by name), with its step and tokens where the line gave them. Compact, as a log prints the same few shapes
of event again and again: a shape's names are written once, in a line that gives them a number, and each event is
then that number and its values, as printed (a whole number as one: ``120``, not ``120.0``)::

    {"t": 1733571234.52}                                        <- when the lines after it were read (a tick, 0.2 s)
    {"id": 0, "names": ["step", "loss", "tok_s"]}               <- a shape's names, before its first event
    [1832, 0, 120, 2.3125, 11873]                               <- an event: the log's byte offset after its line,
    [1901, 0, 121, 2.3101, 11890]                                  its shape, its values

(an older supervisor wrote ``[1832, 1733571234.52, {"step": 120, ...}]``; ``records`` reads both). A supervisor
started again numbers its shapes from 0 again, each written anew before its first event: a reader takes the last
definition of a number it has read. Appended whole lines only, never rewritten: a reader keeps its byte offset in the
file and what it has read there (``records``'s context: the shapes, the time), and reads what is new.
``metrics.state.json`` says how far the log is read, what the reader remembers (the epoch a header opened, a
progress bar's last postfix) and the series' summary to there (``Summary``: the last step, each metric's last,
lowest and highest value), so a status that only shows where the run is never reads the whole series; it is written
after the records it covers are on disk. A supervisor that starts again
(a crash, a reboot, the next attempt) cuts a record half written off the file's end, reads the log again from the
state's offset, and appends only the events after the last record there: none is lost or written twice.
"""

from __future__ import annotations

import base64
import bisect
import json
import math
import os
import re
import time
from itertools import accumulate, repeat

from ..layout import read_json, write_json
from .series_rows import Rows, Summary

__all__ = ["FILE", "LOG", "STATE", "Series", "Summary", "answer", "read", "records"]

FILE = "metrics.jsonl"
STATE = "metrics.state.json"
LOG = "train.log"
READ_MAX = 4 << 20  # bytes of log per tick: a runaway writer cannot hold the supervisor up
SAVE_EVERY_S = 2.0  # how often the state is saved (and the records fsynced) while the log grows
TAIL = 1 << 16  # bytes read back from the file's end to find its last record


class Series:
    """Appends the metric events of ``run_dir``'s log to its ``metrics.jsonl``; ``tick`` reads what is new."""

    def __init__(self, run_dir: str) -> None:
        self.log = os.path.join(run_dir, LOG)
        self.path = os.path.join(run_dir, FILE)
        self.state_path = os.path.join(run_dir, STATE)
        state = read_json(self.state_path)
        if not isinstance(state, dict) or not os.path.exists(self.path):
            state = {}  # no records yet (or none kept): the log from its start
        self.offset = int(state.get("log", 0))
        from ..metrics import metric_lines  # (the supervisor's alone: a log_read of the series needs no reader)

        self.reader = metric_lines.Reader(state.get("reader"))
        self.summary = Summary(state.get("summary"))
        self.saved = time.monotonic()
        self.dirty = False
        self.shapes: dict[tuple[str, ...], int] = {}  # the shapes written by this supervisor, by their names
        # the events already in the file past the state's offset: read again from the log, not appended again
        self.skip_to, self.skip_n = self._last_record()

    def _last_record(self) -> tuple[int, int]:
        """The log offset of the file's last record and how many records end there; a record half written (the
        file's end without its newline) is cut off first."""
        try:
            with open(self.path, "rb+") as fh:
                size = fh.seek(0, os.SEEK_END)
                fh.seek(max(0, size - TAIL))
                tail = fh.read()
                cut = tail.rfind(b"\n") + 1
                if cut < len(tail):
                    fh.truncate(size - len(tail) + cut)
                    tail = tail[:cut]
        except FileNotFoundError:
            return -1, 0
        at, n = -1, 0
        for line in reversed(tail.splitlines()):
            if line.startswith(b"{"):
                continue  # a shape's names or a time, no event
            try:
                end = int(json.loads(line)[0])
            except (ValueError, TypeError, IndexError, KeyError):
                break
            if at >= 0 and end != at:
                break
            at, n = end, n + 1
        return at, n

    def tick(self, final: bool = False) -> None:
        """Append the events of the lines written since the last tick, at most ``READ_MAX`` bytes of them (``final``:
        all of them, to an unterminated last line: the run has ended); save the state every ``SAVE_EVERY_S`` and at
        the end."""
        while self._read(final) and final:
            pass

    def _read(self, final: bool) -> bool:
        """One read of the log; whether it read all ``READ_MAX`` bytes (there may be more)."""
        try:
            with open(self.log, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(READ_MAX)
        except OSError:
            return False
        cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1  # a progress bar's update ends with \r
        if final and len(data) < READ_MAX:
            cut = len(data)
        elif not cut and len(data) >= READ_MAX:
            cut = len(data)  # one line longer than a read
        raws = data[:cut].splitlines(keepends=True)
        ends = list(accumulate(map(len, raws), initial=self.offset))[1:]  # each line's end in the log
        texts = list(map(str.rstrip, map(bytes.decode, raws, repeat("utf-8"), repeat("replace")), repeat("\r\n")))
        rows = Rows(ends, self.shapes, self.summary)
        for table in self.reader.tables(texts):  # (a chunk's events as columns: metric_lines.Reader.tables)
            if (self.skip_to < ends[table.first] or not table.singles and not table.groups) and rows.columns(table):
                continue
            for i, event in table.placed():
                at = ends[i]
                if at < self.skip_to or (at == self.skip_to and self.skip_n > 0):
                    self.skip_n -= at == self.skip_to
                    rows.summed(event)  # already in the file: read again from the log, not appended again
                else:
                    rows.one(i, event)
        text = rows.text()
        self.offset += cut
        if text:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, f'{{"t":{round(time.time(), 2)!r}}}\n{text}\n'.encode())
            finally:
                os.close(fd)
        self.dirty = self.dirty or cut > 0
        more = len(data) >= READ_MAX
        if self.dirty and ((final and not more) or time.monotonic() - self.saved >= SAVE_EVERY_S):
            self.save()
        return more

    def save(self) -> None:
        """The state, once the records it covers are on disk: a later start never skips an event it lost."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            fd = None
        if fd is not None:
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        write_json(self.state_path, {"log": self.offset, "reader": self.reader.state(),
                                     "summary": self.summary.saved()})
        self.saved, self.dirty = time.monotonic(), False


def read(run_dir: str, offset: int = 0, max_bytes: int = 4 << 20, context: dict | None = None) -> tuple[list, int]:
    """The records of ``run_dir``'s series from byte ``offset`` (whole lines only) and the offset after them;
    ``context``: what the reads before this one found (``records``)."""
    data, end = _lines(run_dir, offset, max_bytes)
    return records(data, context), end


def records(data: bytes, context: dict | None = None) -> list:
    """The events of whole lines of the file, each as ``[log offset, time, {name: value}]``: all the lines parsed by
    one ``json`` call. ``context`` carries what a read needs from the lines before it (the shapes' names, the time)
    to the next read from where this one ends, updated in place; an event of a shape not defined there is left out
    (only a read from the middle of a file without the context of its start has one)."""
    if not data:
        return []
    context = context if context is not None else {}
    names: list = context.setdefault("names", [])
    now = context.get("t", 0.0)
    out = []
    for line in json.loads(b"[" + data.rstrip(b"\n").replace(b"\n", b",") + b"]"):
        if line.__class__ is list:
            if line[-1].__class__ is dict:  # an older supervisor's record
                out.append(line)
            elif line[1] < len(names) and names[line[1]] is not None:
                out.append([line[0], now, dict(zip(names[line[1]], line[2:]))])
        elif "t" in line:
            now = line["t"]
        elif "id" in line:
            shape = line["id"]
            names.extend([None] * (shape + 1 - len(names)))
            names[shape] = line["names"]
    context["t"] = now
    return out


def _lines(run_dir: str, offset: int, max_bytes: int) -> tuple[bytes, int]:
    try:
        with open(os.path.join(run_dir, FILE), "rb") as fh:
            fh.seek(offset)
            data = fh.read(max_bytes)
    except FileNotFoundError:
        return b"", offset
    cut = data.rfind(b"\n") + 1
    return data[:cut], offset + cut


def after(run_dir: str, log_offset: int) -> tuple[int, bytes]:
    """Where the series' records of the log's lines past ``log_offset`` start (its records are in the log's order:
    found by halves), and what a reader from there needs of the file before it: every shape's names and the last
    time, as the file's own lines."""
    with open(os.path.join(run_dir, FILE), "rb") as fh:
        data = fh.read()
    end = data.rfind(b"\n") + 1  # (whole lines only)

    def record(at: int) -> tuple[int, float]:
        """The start and log offset of the first record from the line at or after ``at``."""
        if at and data[at - 1:at] != b"\n":
            at = data.find(b"\n", at, end) + 1 or end
        while at < end:
            if data[at:at + 1] == b"[":
                return at, int(data[at + 1:data.index(b",", at)])
            at = data.index(b"\n", at) + 1
        return end, math.inf

    start = record(bisect.bisect_right(range(end + 1), log_offset, key=lambda at: record(at)[1]))[0]
    before = data[:start]
    shapes = b"".join(m.group() + b"\n" for m in _SHAPE.finditer(before))
    t = before.rfind(b'{"t":')  # (only a time's line holds that)
    return start, shapes + (before[t:before.index(b"\n", t) + 1] if t >= 0 else b"")


_SHAPE = re.compile(rb'^\{"id":[^\n]*', re.M)


def answer(run_dir: str, offset: int, max_bytes: int, log_offset: int | None = None) -> dict | None:
    """What a ``log_read`` with ``series_offset`` answers: the file's whole lines from ``offset`` as they are
    (``data``, base64: the controller reads them, ``records``), the offset after them, the file's size, and whether
    the series covers the whole log (the supervisor's last save reached its end), and the series' summary at that
    save (``Summary``; absent from an older supervisor's); None while the run has no record kept (an older
    supervisor, no metric line yet): the log is read then. ``log_offset`` (a read of the log's last lines): from
    the first record past that offset in the log, after the lines a reader needs from before it (``after``)."""
    try:
        size = os.path.getsize(os.path.join(run_dir, FILE))
    except OSError:
        return None
    if not size:
        return None
    before = b""
    if log_offset is not None:
        offset, before = after(run_dir, log_offset)
    data, end = _lines(run_dir, min(offset, size), max_bytes)
    data = before + data
    state = read_json(os.path.join(run_dir, STATE))
    state = state if isinstance(state, dict) else {}
    read_to = state.get("log", 0)
    try:
        log_size = os.path.getsize(os.path.join(run_dir, LOG))
    except OSError:
        log_size = 0
    out = {"data": base64.b64encode(data).decode(), "offset": end, "size": size, "whole": read_to >= log_size}
    if isinstance(state.get("summary"), dict):
        out["summary"] = state["summary"]
    return out
