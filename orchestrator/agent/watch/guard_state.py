"""Where a guarded run's guard stands, as ``status`` reads it: its ``guard.json``, without the watch that writes it
(``guard.py``), so that a status call imports none of the supervisor's modules."""

from __future__ import annotations

import os

from ..layout import read_json

STATE = "guard.json"


def summary(run_dir: str) -> dict | None:
    """What ``status`` reports of a guarded run: its ``guard.json``."""
    state = read_json(os.path.join(run_dir, STATE))
    return state if isinstance(state, dict) else None
