"""A launch refuses to stop some nodes of a job and leave the others (``launch/spare_jobs``), before anything
changes; a job it covers on every node, or a single run, is stopped as before."""

from __future__ import annotations

import pytest

from orchestrator.errors import ConflictError
from orchestrator.launch import spare_jobs

MINE = "0123456789ab"
NODES = [{"rank": 0, "ct": 200, "target": "n0", "label": "CT 200 on pve1", "machine": "ct:200"},
         {"rank": 1, "ct": None, "target": "gpu1", "label": "gpu1", "machine": "ssh:gpu1"}]


def run(registry: str = MINE, nodes: list | None = NODES, clone: dict | None = None) -> dict:
    return {"id": 7, "registry": registry, "state": "running", "clone": clone,
            **({"job": {"nodes": nodes}} if nodes else {})}


def test_one_node_of_a_job_is_refused_naming_the_job_and_the_stop_of_all_of_it():
    with pytest.raises(ConflictError) as err:
        spare_jobs.check({"ssh:gpu1": [run()]}, {"ssh:gpu1": "gpu1"}, MINE, "deploy")
    assert err.value.exit_code == 5
    assert err.value.message == ("gpu1 runs node 1 of experiment 7, a job over 2 nodes (CT 200 on pve1, gpu1): "
                                 "this deploy would stop only that node; nothing was stopped")
    assert err.value.hint == "stop the whole job first: orch stop --ct 200 --target gpu1"


def test_another_clones_job_is_named_as_such_and_a_job_over_some_of_a_new_jobs_nodes_too():
    other = run(registry="ba9876543210", clone={"host": "h", "path": "/p"})
    with pytest.raises(ConflictError) as err:  # a job's deploy over CT 200 and another machine
        spare_jobs.check({"ct:200": [other], "ct:300": []}, {"ct:200": "CT 200", "ct:300": "CT 300"}, MINE, "deploy")
    assert "runs node 0 of experiment 7 of another clone of this project (h, /p)" in err.value.message
    assert err.value.hint.endswith("orch stop --ct 200 --target gpu1 from that clone")


def test_a_job_covered_on_every_node_and_a_single_run_go_on():
    both = {"ct:200": "CT 200", "ssh:gpu1": "gpu1"}
    spare_jobs.check({"ct:200": [run()], "ssh:gpu1": [run()]}, both, MINE, "deploy")
    spare_jobs.check({"ct:200": [run(nodes=None)]}, {"ct:200": "CT 200"}, MINE, "restart")
