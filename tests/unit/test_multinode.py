"""Pure parts of jobs over several nodes: job state from node states, naming nodes, the current target."""

from __future__ import annotations

import pytest

from orchestrator.reach import current
from orchestrator.config import Settings
from orchestrator.launch.multinode import job_state, node_specs


def test_job_state():
    assert job_state(["running", "finished"], [None, 0]) == "running"
    assert job_state(["finished", "finished"], [0, 0]) == "finished"
    assert job_state(["finished", "crashed"], [0, 1]) == "crashed"
    assert job_state(["stopped", "stopped"], [1, 1]) == "stopped"
    assert job_state(["stopped", "crashed"], [1, 1]) == "crashed"


def test_nodes_named_by_repeated_flags_or_a_group():
    s = Settings.model_validate({"targets": {"a": {"kind": "ssh", "host": "a"}, "b": {"kind": "ssh", "host": "b"},
                                             "pair": {"kind": "group", "members": ["b", "a"]}}})
    assert node_specs(s, ["a"], []) is None and node_specs(s, [], [200]) is None
    assert node_specs(s, [], [200, 201]) == ("ct200+ct201", [{"ct": 200}, {"ct": 201}], False)
    assert node_specs(s, ["pair"], []) == ("pair", [{"target": "b"}, {"target": "a"}], True)


def test_a_group_names_single_targets_only():
    with pytest.raises(ValueError):
        Settings.model_validate({"targets": {"g": {"kind": "group", "members": ["nope"]}}})
    with pytest.raises(ValueError):
        Settings.model_validate({"targets": {"g": {"kind": "group"}}})


def test_current_target_remembers_a_jobs_nodes(tmp_path):
    current.save(tmp_path, None, None, nodes=[{"ct": 200}, {"target": "b"}])
    assert current.load(tmp_path) == {"nodes": [{"ct": 200}, {"target": "b"}]}


def test_an_interrupted_job_start_names_the_nodes_that_started_failed_or_had_not_answered():
    from orchestrator.errors import TargetError
    from orchestrator.launch.multinode import Node, interrupted
    from orchestrator.reach.targets import planned_target

    s = Settings.model_validate({"targets": {n: {"kind": "ssh", "host": n} for n in ("a", "b", "c")}})
    nodes = [Node(i, planned_target(s, n, s.targets[n]), s) for i, n in enumerate(("a", "b", "c"))]
    nodes[1].error = TargetError("connection lost")
    a, b, c = (n.target.label for n in nodes)
    assert interrupted(nodes, {0: {"state": "running"}}, 7) == (
        f"started on node 0 ({a}); node 1 ({b}): its start failed (connection lost); node 2 ({c}) had not "
        "answered: each finishes its start by itself once its part of experiment 7 stopped, or leaves that part "
        "running if its stop had not begun; orch status shows which; to go back: orch restart -e 7")
    nodes[1].error = None
    assert interrupted(nodes, {}, None) == (
        f"node 0 ({a}), node 1 ({b}), node 2 ({c}) had not answered (orch status shows whether each started)")
