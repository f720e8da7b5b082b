"""A run's log followed while a page watches it: its metric points and its lines, pushed to every watcher.

One follower per experiment, shared by the pages open on it: a thread running ``watch.follow`` (the follower
``orch logs --follow`` uses: by byte offset, across dropped connections, streamed as the run writes). From the
log's first byte it parses each line into metric events (``logparse``, with the patterns the experiment was
launched with) and keeps every metric by its name, whatever the log calls it, so ``val_loss`` or ``eval_loss``
chart like ``loss``. A follower nobody watches for ``LINGER_S`` is cancelled: with no page open, nothing is
followed and the server idles.

    hub = Hub(settings)
    watcher = hub.watch(7, put)   # put(event) is called from the follower's thread
    ...
    hub.unwatch(7, watcher)
"""

from __future__ import annotations

import codecs
import math
import re
import threading
import time
from collections import deque
from typing import Any, Callable

from ..config import Settings
from ..errors import OrchError

LINGER_S = 5.0  # a follower nobody watches is cancelled after this long (a page reloading keeps it)
LOG_LINES = 400  # log lines a page opening on a run is shown first
CATCH_UP_S = 3.0  # what a follower reads this long after it opened was printed as it read it (not replayed)
X_KEYS = ("step", "total_steps", "epoch", "tokens", "total_tokens")  # counts, not metrics to chart


# what a terminal draws rather than prints: escapes (cursor moves, colours) and control characters but the tab
_CONTROL = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])?|[\x00-\x08\x0b-\x1f\x7f]")


def _shown(line: str) -> str:
    """A log line as a terminal leaves it on screen: its last non-empty ``\\r`` redraw, escapes removed.

        >>> _shown("\\x1b[A  5%|▍ | 5/100\\r 50%|█████ | 50/100\\r")
        ' 50%|█████ | 50/100'
    """
    pieces = [_CONTROL.sub("", p) for p in line.split("\r")]
    return next((p for p in reversed(pieces) if p.strip()), "").rstrip()


class Follower:
    """One experiment's log, followed in a thread; ``snapshot`` and the events ``put`` to each watcher."""

    def __init__(self, settings: Settings, exp_id: int) -> None:
        self.settings, self.exp_id = settings, exp_id
        self.lock = threading.Lock()
        self.watchers: list[Callable[[dict], None]] = []
        self.series: dict[str, Any] = {}  # metric name -> watch.metrics.Series
        self.lines: deque[str] = deque(maxlen=LOG_LINES)
        self.state: dict = {}
        self.error: dict | None = None
        self.done = False
        self.idle_since: float | None = None
        self.cancel = threading.Event()
        self._buf = ""  # text read but not yet parsed: after the last newline or carriage return
        self._open = ""  # the line being written now (after the last newline): the log panel's last line
        self._current: str | None = None
        self._decode = codecs.getincrementaldecoder("utf-8")("replace")  # a character split across reads
        self._axes_moved = False
        self.axes: dict[str, Any] = {}  # "time"/"tokens" -> Series of (step, seconds since start / tokens)
        self.started: float | None = None
        self.opened = time.time()
        self._seq = 0  # the number of the last data event: a page drops those its snapshot already holds
        self._events = 0
        self._step: float | None = None
        self._parser: Any = None
        self.thread = threading.Thread(target=self._run, name=f"orch-ui-follow-{exp_id}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        from ..reach.targets import resolve_target
        from ..records.experiments import ENDED, Registry
        from ..watch.follow import follow
        from ..watch.logparse import Parser
        from ..watch.metrics_view import as_recorded, target_flags

        try:
            with Registry(self.settings.state_dir / "experiments.db", read_only=True) as reg:
                exp = reg.get(self.exp_id)
                run_registry = reg.run_registry(exp.id)
            self.started = exp.started
            self._parser = Parser(as_recorded(self.settings, exp).metrics.patterns or None)
            name, ct = target_flags(self.settings, exp)
            target = resolve_target(self.settings, name, ct, notice=lambda _m: None)
            live = exp.status in ("running", "launching", "queued", "lost")
            result = follow(self.settings, target, self.exp_id, write=self._feed, notice=lambda _m: None,
                            follow=live, registry=run_registry, cancel=self.cancel, whole_lines=False)
            self._feed(b"", end=True)
            self.state = result.state
            ended = {"state": result.state.get("state"), "exit_code": result.state.get("exit_code"),
                     "ended": result.state.get("state") in ENDED}
        except OrchError as exc:
            self.error = {"error": exc.message, "hint": exc.hint}
            ended = {"error": exc.message, "hint": exc.hint}
        except Exception as exc:  # a page must learn that its live view stopped, whatever stopped it
            self.error = {"error": f"following the log failed: {exc}", "hint": None}
            ended = dict(self.error)
        self.done = True
        from .recent import RECENT

        RECENT.forget(self.exp_id)  # (what a page asks of the target as the run ends is asked anew)
        self._send({"type": "end", **ended})

    def _feed(self, data: bytes, end: bool = False) -> None:
        """Log bytes in: the updates they complete parsed (a progress bar's ``\\r`` redraws as they come), their
        points and lines sent on, with the line being drawn now (a bar with no newline yet) as ``current``."""
        text = self._decode.decode(data, final=end)
        self._buf += text
        self._open += text
        cut = len(self._buf) if end else max(self._buf.rfind("\n"), self._buf.rfind("\r")) + 1
        parsed, self._buf = self._buf[:cut], self._buf[cut:]
        *done, self._open = self._open.split("\n")
        if end:
            done, self._open = [*done, self._open], ""
        # a line being redrawn keeps only its last piece: its earlier redraws are never shown again
        if "\r" in self._open:
            pieces = self._open.split("\r")
            self._open = "\r".join(pieces[-2:])
        shown = [s for s in (_shown(line) for line in done) if s.strip()]
        current = _shown(self._open) or None
        lines = [line for line in parsed.replace("\r\n", "\n").split("\n") if line.strip()]
        if not lines and not shown and current == self._current:
            return
        points: dict[str, list] = {}
        now = time.time()
        with self.lock:
            for ev in self._parser.parse_lines(lines):  # (a read's lines together: the reader's chunked path)
                if "step" in ev:
                    self._step = ev["step"]
                x = float(self._step if self._step is not None else self._events)
                self._events += 1
                tokens = ev.get("tokens", ev.get("total_tokens"))
                if tokens is not None and math.isfinite(tokens):
                    self._axis("tokens", x, float(tokens))
                if self.started is not None and now - self.opened > CATCH_UP_S:  # printed now, not replayed
                    self._axis("time", x, max(0.0, now - self.started))
                for key, value in ev.items():
                    if key in X_KEYS or not math.isfinite(value):
                        continue
                    self._point(key, x, float(value))
                    points.setdefault(key, []).append([x, float(value)])
            self.lines.extend(shown)
            self._current = current
            self._seq += 1
            event = {"type": "data", "seq": self._seq, "points": points, "log": shown, "current": current, "at": now}
            if self._axes_moved:  # sent only when they changed: a bar's redraws add no time or tokens of their own
                event["axes"], self._axes_moved = self._axes_dict(), False
        self._send(event)

    def _axis(self, name: str, x: float, value: float) -> None:
        from ..watch.metrics import Series

        s = self.axes.get(name)
        if s is None:
            s = self.axes[name] = Series(max_points=512)
        if s.last is None or x > s.last[0]:
            s.add(x, value)
            self._axes_moved = True

    def _axes_dict(self) -> dict[str, list]:
        return {k: [list(p) for p in s.points()] for k, s in self.axes.items()}

    def _point(self, key: str, x: float, y: float) -> None:
        from ..watch.metrics import Series

        s = self.series.get(key)
        if s is None:
            s = self.series[key] = Series(max_points=2048)
        s.add(x, y)

    def snapshot(self) -> dict:
        """What a page that opens now is shown first: every series so far and the last lines."""
        with self.lock:
            return {"type": "snapshot", "series": {k: [list(p) for p in s.points()] for k, s in self.series.items()},
                    "log": list(self.lines), "current": self._current, "axes": self._axes_dict(), "seq": self._seq,
                    "done": self.done, "error": self.error, "at": time.time()}

    def _send(self, event: dict) -> None:
        with self.lock:
            watchers = list(self.watchers)
        for put in watchers:
            put(event)


class Hub:
    """The followers of the experiments the open pages watch."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.lock = threading.Lock()
        self.followers: dict[int, Follower] = {}

    def watch(self, exp_id: int, put: Callable[[dict], None]) -> Callable[[dict], None]:
        """Start sending ``exp_id``'s events to ``put``, its snapshot first; returns the handle for ``unwatch``."""
        self.tidy()
        with self.lock:
            follower = self.followers.get(exp_id)
            if follower is None or (follower.done and follower.error):  # a failed one is tried again
                follower = self.followers[exp_id] = Follower(self.settings, exp_id)
                follower.start()
        with follower.lock:
            follower.watchers.append(put)
            follower.idle_since = None
        put(follower.snapshot())  # events sent meanwhile come after it, and a page adds only newer points
        return put

    def unwatch(self, exp_id: int, put: Callable[[dict], None]) -> None:
        follower = self.followers.get(exp_id)
        if follower is None:
            return
        with follower.lock:
            if put in follower.watchers:
                follower.watchers.remove(put)
            if not follower.watchers:
                follower.idle_since = time.monotonic()
        timer = threading.Timer(LINGER_S + 0.1, self.tidy)
        timer.daemon = True
        timer.start()

    def tidy(self, now: float | None = None) -> None:
        """Cancel the followers nobody has watched for ``LINGER_S``."""
        now = time.monotonic() if now is None else now
        with self.lock:
            for exp_id, f in list(self.followers.items()):
                if f.idle_since is not None and now - f.idle_since >= LINGER_S:
                    f.cancel.set()
                    del self.followers[exp_id]

    def close(self) -> None:
        with self.lock:
            for f in self.followers.values():
                f.cancel.set()
            self.followers.clear()
