"""The settling rule of a job's row (pure): final only once every node is, with every node's end."""

from __future__ import annotations

from orchestrator.records.job_settle import settle


def node(rank, state, ended=None, code=None, reason=None, **more):
    return {"rank": rank, "state": state, "ended": ended, "exit_code": code, "reason": reason, **more}


def test_a_job_is_not_settled_while_a_node_runs():
    assert settle([node(0, "stopped", 100.0, -15), node(1, "running")]) is None


def test_a_node_not_reached_keeps_the_job_open_whatever_its_last_known_state():
    assert settle([node(0, "stopped", 100.0, -15), node(1, "stopped", 90.0, reachable=False)]) is None


def test_a_stop_not_delivered_keeps_the_job_open():
    assert settle([node(0, "stopped", 100.0, -15), node(1, "stopped", 90.0, stop_pending=True)]) is None


def test_the_job_ends_with_its_last_node_and_names_every_node_first_ended_first():
    done = settle([node(0, "stopped", 280.0, -15, "stopped by torchrun"),
                   node(1, "crashed", 100.0, 3)])
    assert done == {"status": "crashed", "ended": 280.0, "exit_code": 3,
                    "end_reason": "node 1 crashed (exit code 3); node 0 stopped (stopped by torchrun)"}


def test_a_job_that_finished_everywhere_still_has_an_end_reason():
    done = settle([node(0, "finished", 50.0, 0), node(1, "finished", 51.0, 0)])
    assert done is not None
    assert (done["status"], done["ended"], done["exit_code"]) == ("finished", 51.0, 0)
    assert done["end_reason"] == "node 0 finished; node 1 finished"


def test_a_node_without_an_end_time_is_named_last_and_the_end_is_the_known_one():
    done = settle([node(0, "lost", None, None, "the container stopped"), node(1, "stopped", 70.0, -15)])
    assert done is not None
    assert done["ended"] == 70.0 and done["status"] == "crashed"
    assert done["end_reason"] == "node 1 stopped; node 0 lost (the container stopped)"


def test_a_launch_that_started_on_no_node_is_failed():
    done = settle([node(0, "failed", reason="launch interrupted"), node(1, "failed", reason="launch interrupted")])
    assert done is not None and done["status"] == "failed"
