"""`orch experiments export --mlflow` of runs on real containers: CT 200 over SSH, CT 201 over `pct exec`;
each run's log read from its CT into the MLflow run, byte for byte, with where it ran in its tags."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.integration.test_remote import ROOT, on_ct, remote, wait_state  # noqa: F401  (the fixture)

pytestmark = pytest.mark.testbed


def test_runs_on_two_cts_exported_with_their_logs(remote, testbed, tmp_path):
    remote.write(steps=40, sleep=0.0)
    for target in ("ct200", "ct201"):
        res = remote.run("deploy", "--target", target, "--wait", "-m", f"on {target}")
        assert res.returncode == 0, res.stderr
    for target in ("ct200", "ct201"):
        wait_state(remote, ["--target", target], ("finished",))
    uri = f"sqlite:///{tmp_path / 'team.db'}"
    res = remote.run("experiments", "export", "--mlflow", uri)
    assert res.returncode == 0, res.stderr
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("tinylm")
    found = {int(r.data.tags["orch.experiment"]): r for r in client.search_runs([experiment.experiment_id])}
    assert sorted(found) == [1, 2]
    for exp_id, vmid in ((1, 200), (2, 201)):
        run = found[exp_id]
        assert run.info.status == "FINISHED" and run.data.tags["orch.ct"] == str(vmid)
        assert run.data.tags["orch.node"] == testbed.node.name and run.data.tags["orch.target"] == f"ct{vmid}"
        assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [10, 20, 30, 40]
        local = Path(client.download_artifacts(run.info.run_id, "train.log", str(tmp_path)))
        on_target = on_ct(testbed, vmid, "cat", f"{ROOT}/runs/{remote.run_key(exp_id)}/train.log")
        assert local.read_text() == on_target and "step=40" in on_target
        os.unlink(local)
    again = remote.run("experiments", "export", "--mlflow", uri)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("(unchanged; 0 new params, 0 new metric points; log: unchanged)") == 2
    assert len(client.search_runs([experiment.experiment_id])) == 2
