"""``orch logs --metrics`` of a run whose supervisor keeps its metric series (``agent/run/series.py``): the events
of the log's last lines as the supervisor read them, and, following, each new one, in deltas of the series from the
byte the last read ended at; no log line crosses the connection or is read again here.

A run without a series (an older orch's supervisor, no metric line yet) and one whose metrics come from
``[metrics] patterns`` (which need the log's lines) are read from the log (``log_view.MetricLines``), as before.
"""

from __future__ import annotations

import time
from typing import Callable

from ..config import Settings
from ..reach.agent_client import Op
from ..reach.targets import Target
from ..records.experiments import ENDED
from .metrics_view import SERIES_CHUNK, kept_records

ENDED_WAITS = 10


def read(settings: Settings, target: Target, exp_id: int, run_registry: str | None, *,
         emit: Callable[[dict], None], follow: bool, tail_lines: int, poll: float = 0.3) -> dict | None:
    """``emit`` each event of the log's last ``tail_lines`` lines from the run's series (``follow``: then each new
    one, until the run has ended and its series reached its log's end); returns the run's state as the agent last
    told it, or None, having emitted nothing, where the run keeps no series."""
    from ..records.reconcile import client_for

    client = client_for(settings, target, read_only=not follow)
    context: dict = {}
    args: dict = {"exp_id": exp_id, "registry": run_registry, "tail_lines": tail_lines, "identity": None,
                  "max_bytes": SERIES_CHUNK, "series_offset": 0}
    state: dict = {}
    waits = 0  # reads after the run's end told, waiting for the supervisor's last read of its log
    try:
        while True:
            value = client.call([Op("log_read", args)])[0]
            kept, state = value.get("series"), value.get("state") or {}
            if kept is None:
                return None if "tail_lines" in args else state  # (none to begin with: the log is read instead)
            for _, _, event in kept_records(kept["data"], context):
                emit(event)
            args = {"exp_id": exp_id, "registry": run_registry, "offset": 0, "identity": None,
                    "max_bytes": SERIES_CHUNK, "series_offset": kept["offset"]}
            if kept["offset"] < kept["size"]:
                continue
            if not follow:
                return state
            if state.get("state") in ENDED:
                # the supervisor's last read of the log may land just after the end is told: a few more looks, then
                # what it kept (a supervisor killed never reaches its log's end)
                if kept.get("whole") or waits >= ENDED_WAITS:
                    return state
                waits += 1
            time.sleep(poll)
    finally:
        client.transport.close()
