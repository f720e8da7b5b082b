"""How ``orch status`` says a run ended: never ``exit code None`` when no code was recorded (a run killed with its
supervisor, lost, or ended before its command started)."""

from __future__ import annotations

import pytest

from orchestrator.cli.status import _how_it_ended


@pytest.mark.parametrize("run, said", [
    ({"state": "finished", "exit_code": 0}, " (exit code 0)"),
    ({"state": "crashed", "exit_code": 1, "end_reason": "exit code 1"}, " (exit code 1)"),
    ({"state": "stopped", "exit_code": -15, "end_reason": "stopped by experiment 7"},
     " (exit code -15; stopped by experiment 7)"),
    ({"state": "stopped", "exit_code": None, "end_reason": "stopped by experiment 7"}, " (stopped by experiment 7)"),
    ({"state": "stopped", "exit_code": None}, " (no exit code)"),
    ({"state": "failed", "exit_code": None}, " (no exit code)"),
    ({"state": "finished", "exit_code": None}, " (no exit code)"),
    ({"state": "lost", "exit_code": None, "end_reason": "its supervisor vanished"}, " (its supervisor vanished)"),
    ({"state": "running", "exit_code": None}, ""),
])
def test_how_a_run_ended_never_says_none(run, said):
    assert _how_it_ended(run) == said
    assert "None" not in _how_it_ended(run)
