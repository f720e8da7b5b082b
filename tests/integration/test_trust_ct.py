"""Secrets and killed deploys on real containers: CT 200 over SSH, CT 201 through the node's ``pct exec``.

A secret value is searched for, byte for byte, in the registry, everything under the CT's /workspace, orch's
output and every process's command line inside the CT and on this machine: it is only in the run's
environment. A deploy SIGKILLed after its row was created, or after its run started, leaves no row
``launching`` once ``orch status`` has reached the CT.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time

import pytest

from tests.cli.test_phantoms import book, rows
from tests.cli.test_secrets import WATCHER, every_cmdline, files_under
from tests.cli.test_workflow import wait_for
from tests.integration.test_remote import ROOT, on_ct, remote  # noqa: F401  (the fixture)

pytestmark = pytest.mark.testbed


def configure(remote) -> None:
    (remote.path / "watch.py").write_text(WATCHER)
    remote.write(sources='["watch.py"]')
    path = remote.path / "orch.toml"
    path.write_text(path.read_text().replace('command = "python3 train.py"', 'command = "python3 watch.py"\n'
                                             'secrets = ["WANDB_API_KEY", "HF_TOKEN"]'))


def test_a_secret_reaches_only_the_runs_environment_in_the_ct(remote, testbed):
    configure(remote)
    key, token = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    (remote.path / ".orch").mkdir(exist_ok=True)
    (remote.path / ".orch" / "secrets.env").write_text(f"HF_TOKEN={token}\n")
    (remote.path / ".orch" / "secrets.env").chmod(0o600)
    outputs, cmdlines = [], []
    for vmid, target in ((200, "ct200"), (201, "ct201")):  # over SSH, and through pct exec on the node
        res = remote.run("deploy", "--target", target, env={"WANDB_API_KEY": key})
        outputs += [res.stdout, res.stderr]
        assert res.returncode == 0, res.stderr
        exp_id = max(rows(remote))
        log_path = f"{ROOT}/runs/{remote.run_key(exp_id)}/train.log"
        deadline = time.monotonic() + 30
        while "step=1" not in (log := on_ct(testbed, vmid, "cat", log_path)):  # after both lines (and orch's own)
            assert time.monotonic() < deadline, log
            time.sleep(0.2)
        assert f"WANDB_API_KEY {hashlib.sha256(key.encode()).hexdigest()}" in log
        assert f"HF_TOKEN {hashlib.sha256(token.encode()).hexdigest()}" in log
        ct = testbed.ct(vmid)
        # a process may end between the glob and its read: what it held is gone with it
        cmdlines.append(ct.attach("sh", "-c", "cat /proc/[0-9]*/cmdline 2>/dev/null; true").stdout)
        cmdlines += every_cmdline()
        pid = json.loads(on_ct(testbed, vmid, "cat", f"{ROOT}/runs/{remote.run_key(exp_id)}/pid.json"))["child"]
        assert token.encode() in ct.attach("cat", f"/proc/{pid}/environ").stdout
        assert "secrets.pipe" not in on_ct(testbed, vmid, "ls", f"{ROOT}/runs/{remote.run_key(exp_id)}")
        for args in (["status", "--target", target], ["experiments", "show", str(exp_id)],
                     ["logs", "--target", target, "-n", "50"], ["stop", "--target", target]):
            res = remote.run(*args)
            outputs += [res.stdout, res.stderr]
            assert res.returncode == 0, res.stderr
        stored = ct.attach("tar", "-C", "/workspace", "-cf", "-", ".").stdout
        for value in (key, token):
            assert value.encode() not in stored, f"{value} is in a file under /workspace on CT {vmid}"
    stored_here = files_under(remote.path / ".orch")
    stored_here.pop(str(remote.path / ".orch" / "secrets.env"))
    for value in (key, token):
        assert not [p for p, data in stored_here.items() if value.encode() in data]
        assert not [text for text in outputs if value in text]
        assert not [c for c in cmdlines if value.encode() in c]
    assert remote.registry().get(1).public()["secrets"] == ["WANDB_API_KEY", "HF_TOKEN"]


def test_sigkill_of_a_deploy_to_a_ct_leaves_no_launching_row(remote, testbed, tmp_path):
    marker = tmp_path / "marker"
    after_record = book(remote, "after-record", ["preflight", "push_revision", "record", "pause", "start_run",
                                                 "verify_started"], marker)
    after_start = book(remote, "after-start", ["preflight", "push_revision", "record", "start_run", "pause",
                                               "verify_started"], marker)
    # the marker is touched inside the CT: the test sees it through lxc-attach
    for path in (after_record, after_start):
        path.write_text(path.read_text().replace(str(marker), "/tmp/orch-marker"))
    for path in (after_record, after_start):
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "play", str(path)],
                                cwd=remote.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env={**os.environ})
        wait_for(lambda: testbed.ct(200).attach("test", "-e", "/tmp/orch-marker", check=False).returncode == 0,
                 timeout=60, what="the pause step")
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        testbed.ct(200).attach("rm", "-f", "/tmp/orch-marker")
    before = rows(remote)  # the second play reached the CT, so it settled the first kill's launch
    assert before[1].status == "failed" and before[2].status == "launching"
    status = remote.run("status", "--json")
    assert status.returncode == 0, status.stderr
    data = json.loads(status.stdout)
    assert data["experiment"] == 2 and data["state"] == "running"
    now = rows(remote)
    assert now[1].status == "failed" and "launch interrupted" in now[1].error
    assert now[2].status == "running"
    runs = on_ct(testbed, 200, "ls", f"{ROOT}/runs").split()
    assert remote.run_key(2) in runs
    # the first launch was killed inside its locked call, before its start: its folder holds only its journal and
    # the work folder made for its shell step (a step after `record` runs where the run would)
    assert on_ct(testbed, 200, "ls", "-A", f"{ROOT}/runs/{remote.run_key(1)}").split() == ["journal.jsonl", "work"]
    assert '"event":"begin"' in on_ct(testbed, 200, "cat", f"{ROOT}/runs/{remote.run_key(1)}/journal.jsonl")
    restart = remote.run("restart", "--json")
    assert restart.returncode == 0, restart.stderr
    assert json.loads(restart.stdout)["experiment"]["parent"] == 2
    assert remote.run("stop").returncode == 0
