"""How a run ended, in words, from what the target reports (pure)."""

from __future__ import annotations

import time

from orchestrator.records.end_reason import describe

ME, OTHER = "aaaaaaaaaaaa", "bbbbbbbbbbbb"


def test_signals_are_named_with_their_cause():
    assert describe({"state": "crashed", "exit_code": 129, "signal": 1, "cause": "the tmux server went away"}) \
        == "SIGHUP: the tmux server went away"
    assert describe({"state": "crashed", "exit_code": 137, "signal": 9}) == "SIGKILL"
    assert describe({"state": "crashed", "exit_code": 3}) == "exit code 3"
    assert describe({"state": "finished", "exit_code": 0}) is None


def test_who_stopped_a_run():
    mine = {"experiment": 7, "registry": ME, "clone": {"host": "h", "path": "/p"}}
    assert describe({"state": "stopped", "stopped_by": mine}, ME) == "stopped by experiment 7"
    assert describe({"state": "stopped", "stopped_by": mine}, OTHER) == \
        "stopped by experiment 7 of another clone of this project (h, /p)"
    assert describe({"state": "stopped", "stopped_by": {**mine, "experiment": None}}, ME) == "stopped by orch stop"
    assert describe({"state": "stopped"}, ME) is None  # a marker from an older agent: nobody named
    # a trial a search's conductor on the target pruned: its registry is none of a clone's
    assert describe({"state": "stopped", "stopped_by": {"sweep": "s4be1f0"}}, ME) == \
        "stopped by the conductor of sweep s4be1f0"


def test_a_lost_run_has_no_end_time_only_when_it_was_noticed():
    now = time.mktime((2026, 11, 30, 15, 20, 11, 0, 0, -1))
    assert describe({"state": "lost", "cause": "the container stopped"}, ME, now) == \
        "the container stopped; end time unknown, noticed at 2026-11-30 15:20:11"


def test_one_wording_for_a_stop_whoever_records_it():
    """The launch that stopped a run, the journal settled later and the target's record all say the same."""
    from orchestrator.records import launch_journal as journal
    from orchestrator.records.end_reason import stopped_by

    told = {"failed": {"op": "run_start", "kind": "error", "message": "tmux died"}}
    recorded = describe({"state": "stopped", "stopped_by": {"experiment": 2, "registry": ME}}, ME)
    assert recorded == stopped_by({"experiment": 2}) == journal.stopped_reason(2, {}) == "stopped by experiment 2"
    assert journal.stopped_reason(2, told) == stopped_by({"experiment": 2}, why=" (whose start then failed)") \
        == "stopped by experiment 2 (whose start then failed)"
    assert describe({"state": "crashed", "signal": 99}) == "signal 99"


def test_a_run_interrupted_by_the_shutdown_is_named_so_with_its_known_end():
    run = {"state": "lost", "cause": "interrupted by the container's shutdown", "ended": 1796140547.5}
    assert describe(run, ME, time.time()) == "interrupted by the container's shutdown"
