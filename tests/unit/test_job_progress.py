"""How a job's progress reads in orch status, and which ended node --wait reports (pure)."""

from __future__ import annotations

from orchestrator.watch.job_progress import job_note, node_facts, node_note, summary
from orchestrator.launch.job_wait import first_to_tell


def _rec(rank: int, quiet: float | None, line: str | None, **more) -> dict:
    return {"rank": rank, "state": "running", "quiet_s": quiet, "last_line": line, **more}


def test_a_silent_node_reads_against_the_jobs_progress_not_as_an_alarm():
    records = [_rec(0, 1.0, "step=41 loss=2.1"), _rec(1, 107.0, None)]
    moved = summary(records)
    assert moved == {"moved_s": 1.0, "by": 0}
    assert job_note(moved, 8) == "; the job moved 1 s ago (node 0)"
    assert node_note(records[1], moved, 2) == ["no output (node 1 prints nothing; the job moves)"]
    assert node_note(records[0], moved, 2) == ["last line 1 s ago"]
    quiet = _rec(1, 107.0, "rendezvous done")
    assert node_note(quiet, moved, 2) == ["quiet for 107 s while the job moves"]


def test_no_node_moving_is_said_per_the_job_rule():
    records = [_rec(0, 40.0, "step=3"), _rec(1, 45.0, None)]
    assert job_note(summary(records), 60) == "; no node has moved for 40 s (stalled at 60 s: [run] stall_after)"
    assert job_note(summary(records), None) == "; the job moved 40 s ago (node 0)"
    assert job_note(summary([_rec(0, 75.0, "x")]), None) == "; no node has moved for 75 s"
    assert summary([{**records[0], "state": "finished"}]) is None


def test_missing_heartbeats_and_a_port_that_could_not_be_bound_are_said():
    run = {"now": 1000.0, "log_mtime": 990.0, "log_size": 0, "started": 900.0,
           "heartbeat": {"error": None, "peers": {"0": {"heard": 999.0}, "2": {"heard": 960.0}}}}
    facts = node_facts(run)
    assert facts["quiet_s"] == 10.0 and facts["running_s"] == 100.0 and facts["heard_s"] == {"0": 1.0, "2": 40.0}
    rec = _rec(1, **{k: v for k, v in facts.items() if k != "quiet_s"}, quiet=10.0, line=None)
    assert node_note(rec, summary([rec]), 4)[-1] == "no heartbeat from node 2, 3 (UDP: [distributed] heartbeat_port)"
    rec["heartbeat_error"] = "cannot listen on UDP port 29401: Address already in use"
    assert "cannot listen on UDP port 29401: Address already in use: stalls judged on its own log" in \
        node_note(rec, None, 4)


def test_wait_reports_a_crashed_node_before_one_that_ended_otherwise_then_the_first_to_end():
    assert first_to_tell([(0, {"state": "finished", "ended": 5.0}), (1, {"state": "crashed", "ended": 9.0})]) == 1
    assert first_to_tell([(0, {"state": "crashed", "ended": 9.0}), (1, {"state": "crashed", "ended": 8.0})]) == 1
    assert first_to_tell([(0, {"state": "stopped", "ended": 1.0}), (1, {"state": "lost"})]) == 1
