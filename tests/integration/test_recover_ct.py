"""Runs that recover, in a real LXC container: restarts by the on-target supervisor, and container reboots."""

from __future__ import annotations

import json
import time

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
    log = on_ct(testbed, 200, "cat", f"{ROOT}/runs/{remote.run_key(1)}/train.log")
    assert f"[orch] attempt 2 of 3 after exit code 1; resuming from {CKPT}/ckpt-0.pt" in log


# prints a step every 0.1 s and checkpoints every 5; resumes from the step saved in ORCH_RESUME_FROM
LONG = """\
import os, pathlib, time
ck = pathlib.Path(os.environ["ORCH_CHECKPOINT_DIR"])
src = os.environ.get("ORCH_RESUME_FROM")
begin = int(pathlib.Path(src).read_text()) if src else 0
print(f"attempt {os.environ['ORCH_ATTEMPT']} from step {begin}", flush=True)
for step in range(begin, begin + 100000):
    print(f"step={step} loss=1.0", flush=True)
    if step % 5 == 0:
        (ck / f"ckpt-{step:06d}.pt").write_text(str(step))
    time.sleep(0.1)
"""


SHUTDOWN = "interrupted by the container's shutdown"
# a hard power-off (every process gone at once, nothing recorded) and a graceful stop (pct shutdown, a node
# reboot: the CT's init sends SIGTERM to every process, the supervisor sees the shutdown)
REBOOTS = pytest.mark.parametrize("graceful", [False, True], ids=["lxc-stop -k", "lxc-stop"])


def _reboot(remote, testbed, graceful: bool = False, checkpointed: bool = True) -> float:
    """The CT stopped under the run and started again; returns when the start was asked."""
    deadline = time.monotonic() + 30
    while checkpointed and "ckpt-000010.pt" not in on_ct(testbed, 200, "ls", CKPT):
        assert time.monotonic() < deadline, "the run never checkpointed"
        time.sleep(0.3)
    testbed.shutdown(200) if graceful else testbed.stop(200)
    asked = time.time()
    testbed.start(200)
    return asked


@REBOOTS
def test_a_ct_restart_leaves_the_run_lost_never_running(remote, testbed, graceful):
    _deploy(remote, LONG)
    wait_state(remote, CT, ("running",))
    _reboot(remote, testbed, graceful)
    data = wait_state(remote, CT, ("lost", "running"), timeout=30)
    assert data["state"] == "lost"
    show = json.loads(remote.cli("experiments", "show", "1", "--json").stdout)
    assert show["status"] == "lost"
    status = remote.cli("status", *CT).output
    if graceful:  # the supervisor saw the shutdown: when and why are known, and it is no crash
        assert show["end_reason"] == SHUTDOWN and show["ended"] is not None, show
        assert f"experiment 1 lost ({SHUTDOWN})" in status, status
        log = on_ct(testbed, 200, "cat", f"{ROOT}/runs/{remote.run_key(1)}/train.log")
        assert f"[orch] {SHUTDOWN}: orch restart resumes it from its newest checkpoint" in log
    else:
        assert show["end_reason"].startswith("the container stopped; end time unknown"), show
        assert "experiment 1 lost" in status, status


def _systemd_or_skip(remote, testbed) -> None:
    """The run's reboot unit is installed where the CT runs systemd (the testbed's image does)."""
    units = on_ct(testbed, 200, "ls", "/etc/systemd/system")
    if on_ct(testbed, 200, "sh", "-c", "test -d /run/systemd/system && echo yes || echo no").strip() != "yes":
        log = on_ct(testbed, 200, "cat", f"{ROOT}/runs/{remote.run_key(1)}/train.log")
        assert "orch-resume-" not in units and "does not run systemd" in log
        pytest.skip("the CT image does not run systemd: the run is reported lost (see the test above)")
    assert "orch-resume-" in units


@REBOOTS
def test_resume_after_reboot_starts_a_new_attempt_from_the_latest_checkpoint(remote, testbed, graceful):
    _deploy(remote, LONG, "run.resume_after_reboot=true")
    wait_state(remote, CT, ("running",))
    _systemd_or_skip(remote, testbed)
    asked = _reboot(remote, testbed, graceful)
    deadline = time.monotonic() + 60
    while True:
        data = wait_state(remote, CT, ("running", "lost"), timeout=30)
        if data["state"] == "running" and data.get("attempt") == 2:
            break
        assert time.monotonic() < deadline, data
        time.sleep(0.3)
    show = json.loads(remote.cli("experiments", "show", "1", "--json").stdout)
    first, second = show["attempts"]
    assert first["reason"] == (SHUTDOWN if graceful else "lost"), first
    assert second["resumed_from"].startswith(f"{CKPT}/ckpt-")
    saved = int(on_ct(testbed, 200, "cat", second["resumed_from"]))
    deadline = time.monotonic() + 20
    log_path = f"{ROOT}/runs/{remote.run_key(1)}/train.log"
    while f"attempt 1 from step {saved}" not in (log := on_ct(testbed, 200, "cat", log_path)):
        assert time.monotonic() < deadline, log[-2000:]
        time.sleep(0.3)
    after = "the container's shutdown" if graceful else "a container restart (lost)"
    assert f"[orch] attempt 2 of 2 after {after}; resuming from {second['resumed_from']}" in log
    status = remote.cli("status", *CT).output
    assert "experiment 1 running" in status and "crashed" not in status, status
    if graceful:
        assert f"last failure: {SHUTDOWN}" in status, status
        assert f"[orch] {SHUTDOWN}: it resumes at the next boot" in log
    print(f"CT start -> resumed attempt started: {second['started'] - asked:.2f} s")
    stop = remote.cli("stop", *CT)
    assert stop.exit_code == 0, stop.output
    assert "orch-resume-" not in on_ct(testbed, 200, "ls", "/etc/systemd/system")


def test_a_run_stopped_with_orch_stop_stays_stopped_after_a_reboot(remote, testbed):
    _deploy(remote, LONG, "run.resume_after_reboot=true")
    wait_state(remote, CT, ("running",))
    _systemd_or_skip(remote, testbed)
    stop = remote.cli("stop", *CT)
    assert stop.exit_code == 0, stop.output
    _reboot(remote, testbed, graceful=True, checkpointed=False)
    testbed.ct(200).attach("systemctl", "is-system-running", "--wait", check=False)  # booted: any unit has run
    data = wait_state(remote, CT, ("stopped", "running", "lost"), timeout=30)
    assert data["state"] == "stopped" and data["attempt"] == 1, data
    show = json.loads(remote.cli("experiments", "show", "1", "--json").stdout)
    assert show["status"] == "stopped" and len(show["attempts"]) == 1, show
    assert "orch-resume-" not in on_ct(testbed, 200, "ls", "/etc/systemd/system")
