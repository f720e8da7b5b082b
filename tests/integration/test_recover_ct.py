"""Runs that recover, in a real LXC container: restarts by the on-target supervisor, and container reboots."""

from __future__ import annotations

import json

import pytest

from tests.cli.test_recover import FLAKY
from tests.integration.test_remote import CKPT, ROOT, on_ct, remote, wait_state  # noqa: F401 (fixture)

pytestmark = pytest.mark.testbed

CT = ["--ct", "200"]


def _deploy(remote, script: str, *sets: str) -> None:
    (remote.path / "job.py").write_text(script)
    args = ["--set", "project.sources=['job.py']", "--set", "project.command=python3 job.py"]
    for s in sets:
        args += ["--set", s]
    res = remote.cli("deploy", *CT, "--json", *args)
    assert res.exit_code in (0, 1), res.output


def test_a_crash_is_restarted_in_the_ct_and_recorded(remote, testbed):
    _deploy(remote, FLAKY.replace("{ok_at}", "1"), "run.restarts=2", "run.backoff=[0.2]")
    final = wait_state(remote, CT, ("finished",))
    assert final["exit_code"] == 0
    show = json.loads(remote.cli("experiments", "show", "1", "--json").stdout)
    assert [a["exit_code"] for a in show["attempts"]] == [1, 0]
    assert show["attempts"][1]["resumed_from"] == f"{CKPT}/ckpt-0.pt"
    log = on_ct(testbed, 200, "cat", f"{ROOT}/runs/1/train.log")
    assert f"[orch] attempt 2 of 3 after exit code 1; resuming from {CKPT}/ckpt-0.pt" in log
