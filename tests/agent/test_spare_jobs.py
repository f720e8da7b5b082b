"""The locked start check of a launch on one target: a run that is one node of a job (started since the launch's
probe looked) is never stopped alone; a single run, or the same check for a job's own launch, goes on."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from orchestrator.agent.run import runs, start_check
from orchestrator.agent.layout import Layout
from orchestrator.agent.protocol import AgentFailure

REGISTRY = "0123456789ab"


def _live_run(layout: Layout, exp_id: int, nodes: list | None) -> subprocess.Popen:
    """A run folder of project ``p`` whose supervisor is a live process of ours."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    folder = layout.run_dir(exp_id, REGISTRY)
    os.makedirs(folder)
    with open(os.path.join(folder, "experiment.json"), "w") as fh:
        json.dump({"id": exp_id, "project": "p", **({"nodes": nodes} if nodes else {})}, fh)
    with open(os.path.join(folder, "pid.json"), "w") as fh:
        json.dump({"supervisor": proc.pid, "supervisor_start": runs._proc_start(proc.pid), "started": 1.0}, fh)
    return proc


def _check(layout: Layout, spare_jobs: bool) -> dict:
    return start_check.check(layout, 9, "p", "rev", registry=REGISTRY, stops_runs=True, revision_pending=True,
                             spare_jobs=spare_jobs)


@pytest.mark.skipif(not __import__("shutil").which("tmux"), reason="the check wants tmux")
def test_a_node_of_a_job_is_refused_a_single_run_is_not(tmp_path):
    layout = Layout(str(tmp_path / "root"))
    nodes = [{"rank": 0, "ct": 200, "label": "CT 200", "machine": "ct:200", "target": "n0", "argv": ["x"]},
             {"rank": 1, "ct": 201, "label": "CT 201", "machine": "ct:201", "target": "n1"}]
    job = _live_run(layout, 3, nodes)
    try:
        state = runs.status(layout, "p")["runs"][0]
        assert state["state"] == "running"
        assert state["job"] == {"nodes": [{k: n.get(k) for k in runs.JOB_NODE_KEYS} for n in nodes]}
        with pytest.raises(AgentFailure) as err:
            _check(layout, spare_jobs=True)
        assert err.value.kind == "conflict"
        assert "experiment 3 of project p runs here as one node of a job over 2 nodes" in str(err.value)
        assert "nothing was stopped" in str(err.value)
        assert job.poll() is None
        assert _check(layout, spare_jobs=False)["run_dir"] == layout.run_dir(9, REGISTRY)  # a job's own launch
    finally:
        job.kill()
        job.wait()
    single = _live_run(layout, 4, None)
    try:
        assert "job" not in runs.status(layout, "p", ids=[4])["runs"][0]
        assert _check(layout, spare_jobs=True)["run_dir"] == layout.run_dir(9, REGISTRY)
    finally:
        single.kill()
        single.wait()
