"""The wheel-installed orch (a fresh venv outside the checkout) runs the whole lifecycle on a real CT by id."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.conftest import EXAMPLE
from tests.integration.test_remote import RemoteProject
from tests.conftest import wait_for
from tests.packaging.test_wheel import _env, _run, installed, wheel  # noqa: F401 (the fixtures)

pytestmark = pytest.mark.testbed


def test_a_wheel_installed_orch_deploys_to_a_ct_by_id(installed, testbed, tmp_path, ct200):
    path = tmp_path / "proj"
    path.mkdir()
    shutil.copy(EXAMPLE / "train.py", path / "train.py")
    proj = RemoteProject(path, testbed)
    proj.write(entries=False)  # no target entries: the bare CT id, resolved through the Proxmox API
    env = dict(_env(installed), ORCH_PROXMOX_TOKEN=testbed.api.token_secret)

    def orch(*args: str) -> subprocess.CompletedProcess:
        return _run([str(installed / "orch"), *args], 120, cwd=path, env=env)

    first = json.loads(orch("deploy", "--ct", "200", "-m", "from the wheel", "--json").stdout)
    assert first["experiment"]["status"] == "running" and first["target_label"].startswith("CT 200")
    # bare commands now act on CT 200, the current target
    status = wait_for(lambda: (s := json.loads(orch("status", "--json").stdout))["summary"].get("step") is not None
                      and s, timeout=120, what="the run's first step")
    assert status["experiment"] == 1 and status["state"] == "running"
    assert "step=" in orch("logs", "-n", "5").stdout
    second = json.loads(orch("restart", "--clean-checkpoints", "--yes", "--json").stdout)
    assert second["experiment"]["parent"] == 1 and [r["id"] for r in second["stopped"]] == [1]
    assert "2" in orch("stop").stdout
    assert json.loads(orch("status", "--json").stdout)["state"] == "stopped"
