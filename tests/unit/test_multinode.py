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
