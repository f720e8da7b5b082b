"""Notifications sent from inside real LXC containers, by the run's supervisor, to a real HTTP server on the
testbed's bridge, with no orch command running: a crash (over ssh) and a stall (over pct) in each format's
shape, a dead webhook that leaves the run alone, and ``orch notify test`` from the CT."""

from __future__ import annotations

import json

import pytest

from tests.cli.test_notify import JOB
from tests.integration.test_remote import ROOT, on_ct, remote, wait_state  # noqa: F401 (fixture)
from tests.webhook import Webhook

pytestmark = pytest.mark.testbed

BRIDGE = "10.77.0.1"  # the host's address on the testbed's bridge (TESTBED.md)


def _deploy(remote, ct: int, mode: str, *sets: str) -> None:
    (remote.path / "job.py").write_text(JOB)
    args = ["--set", "project.sources=['job.py']", "--set", "project.command=python3 job.py",
            "--set", f"project.env={{JOB_MODE = '{mode}'}}"]
    for s in sets:
        args += ["--set", s]
    res = remote.run("deploy", "--ct", str(ct), *args)
    assert res.returncode == 0, res.stdout + res.stderr


def _by_ct(received) -> dict:
    return {r.json()["ct"]: r.json() for r in received}


@pytest.mark.parametrize("fmt", ["slack", "discord", "ntfy", "json"])
def test_a_crash_and_a_stall_arrive_from_the_cts(remote, testbed, fmt):
    with Webhook(BRIDGE) as hook, Webhook(BRIDGE) as shape:
        remote.write(extra=f'[notify]\nurl = "{hook.url}"\nformat = "json"\non = ["crashed", "stalled"]\n')
        _deploy(remote, 200, "crash")  # over ssh
        _deploy(remote, 201, "stall", "run.stall_after=2", "notify.on=['stalled']")  # over pct
        got = _by_ct(hook.wait(2, timeout=90))
        node = testbed.node.name
        crash, stall = got[200], got[201]
        assert crash["event"] == "crashed" and crash["details"]["exit_code"] == 3
        assert crash["title"] == f"orch: experiment 1 of tinylm crashed (exit code 3) on CT 200 on {node}"
        assert crash["node"] == node and crash["look"] == "orch logs -e 1"
        assert "RuntimeError: CUDA error: out of memory" in crash["text"]
        assert stall["event"] == "stalled" and stall["experiment"] == 2
        assert stall["title"] == f"orch: experiment 2 of tinylm stalled (no new log line for 2 s) on CT 201 on {node}"
        # the same two events in the format under test, from the same CTs
        remote.write(extra=f'[notify]\nurl = "{shape.url}"\nformat = "{fmt}"\non = ["crashed", "stalled"]\n')
        _deploy(remote, 200, "crash")
        _deploy(remote, 201, "stall", "run.stall_after=2", "notify.on=['stalled']")
        texts = [_text(fmt, r) for r in shape.wait(2, timeout=90)]
        assert any("experiment 3 of tinylm crashed (exit code 3) on CT 200" in t and "orch logs -e 3" in t
                   for t in texts), texts
        assert any("experiment 4 of tinylm stalled (no new log line for 2 s) on CT 201" in t for t in texts), texts


def _text(fmt: str, got) -> str:
    if fmt == "slack":
        return got.json()["text"]
    if fmt == "discord":
        assert len(got.json()["content"]) <= 2000
        return got.json()["content"]
    if fmt == "ntfy":
        assert got.headers["Priority"] == "high" and got.headers["Tags"]
        return got.headers["Title"] + "\n" + got.body.decode()
    assert got.json()["schema"] == "orch.notify/1"
    return got.json()["text"]


def test_a_dead_webhook_leaves_the_ct_run_alone(remote, testbed):
    with Webhook(BRIDGE, status=500) as hook:
        remote.write(extra=f'[notify]\nurl = "{hook.url}"\non = ["finished"]\n')
        _deploy(remote, 200, "finish")
        assert len(hook.wait(3, timeout=60)) == 3  # three tries, each answered 500
        final = wait_state(remote, ["--ct", "200"], ("finished",))
        assert final["exit_code"] == 0
        run = f"{ROOT}/runs/{remote.run_key(1)}"
        entry = json.loads(on_ct(testbed, 200, "tail", "-n", "1", f"{run}/notify.log"))
        assert entry["ok"] is False and entry["error"] == "HTTP 500 Internal Server Error"
        status = remote.run("status", "--ct", "200")
        assert "notifications: 0 sent, 1 failed (last: finished: HTTP 500 Internal Server Error)" in status.stdout
        found = testbed.ct(200).attach("grep", "-rl", "T0SECRET", run, ROOT + "/agent", check=False)
        assert found.returncode == 1 and found.stdout == b""  # grep: no file holds it
        assert b"T0SECRET" not in (remote.path / ".orch" / "experiments.db").read_bytes()


def test_notify_test_from_a_ct(remote, testbed):
    with Webhook(BRIDGE) as hook:
        remote.write(extra=f'[notify]\nurl = "{hook.url}"\nformat = "ntfy"\n')
        res = remote.run("notify", "test", "--ct", "201")
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == "sent a ntfy test notification from CT 201 on " \
            f"{testbed.node.name}: HTTP 200"
        got = hook.wait(1)[0]
        assert got.headers["Title"].startswith("orch: project tinylm test notification on CT 201")
