"""The last answers of the commands a page runs to read a target (``orch status``, ``orch checkpoints list``), kept a
little while: pages open on a live run ask again and again, and each answer is an orch process of its own and an
agent call on the target, which a user's own ``orch status`` then waits beside (on a loaded machine, its time).

    answer = RECENT.get(("status", 7), lambda: actions.orch(settings, "status", "--json"))

An answer is given again for ``REFRESH_S``, the page's own refresh interval; one command at a time per key, the
requests that come meanwhile take its answer. A failed answer is not kept, and an experiment's answers are forgotten
when the page changes it (a stop, a restart) and when its run's log ends.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

REFRESH_S = 5.0


class Recent:
    def __init__(self, keep_s: float = REFRESH_S) -> None:
        self.keep_s = keep_s
        self.lock = threading.Lock()
        self.kept: dict[tuple, tuple[float, Any]] = {}
        self.asking: dict[tuple, threading.Lock] = {}

    def get(self, key: tuple, ask: Callable[[], Any]) -> Any:
        """The answer kept for ``key`` while fresh, else ``ask()``'s (kept where it is ``ok``)."""
        with self.lock:
            one = self.asking.setdefault(key, threading.Lock())
        with one:
            with self.lock:
                kept = self.kept.get(key)
            if kept is not None and time.monotonic() - kept[0] < self.keep_s:
                return kept[1]
            answer = ask()
            if getattr(answer, "ok", False):
                with self.lock:
                    self.kept[key] = (time.monotonic(), answer)
            return answer

    def forget(self, exp_id: int) -> None:
        """Every answer kept about experiment ``exp_id`` (the last item of its keys)."""
        with self.lock:
            for key in [k for k in self.kept if k[-1] == exp_id]:
                del self.kept[key]


RECENT = Recent()
