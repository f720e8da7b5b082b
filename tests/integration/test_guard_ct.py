"""``deploy --guard`` on a testbed CT: the CT's supervisor watches the new run and puts the parent back by itself."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import pytest

from tests.cli.test_guard import JOB
from tests.integration.test_remote import CKPT, ROOT, RemoteProject, on_ct, remote  # noqa: F401 (fixture)
from tests.waits import wait_for

pytestmark = pytest.mark.testbed

CT = ["--ct", "200"]
SETS = ["--set", "project.sources=['job.py']", "--set", "project.command=python3 job.py", "--set", "guard.steps=20"]


def write_job(p, sleep: float, crash: int = 0) -> None:
    (p.path / "job.py").write_text(JOB.format(sleep=sleep, crash=crash))


def ct_files(testbed) -> str:
    """Every checkpoint file with its hash, as the CT holds them."""
    return on_ct(testbed, 200, "sh", "-c", f"cd {CKPT} && sha256sum ckpt-* 2>/dev/null || true")


def ct_cat(testbed, path: str) -> str:
    return on_ct(testbed, 200, "sh", "-c", f"cat {path} 2>/dev/null || true")


def units(testbed) -> str:
    """The units the CT's systemd starts at its next boot."""
    return on_ct(testbed, 200, "sh", "-c", "ls /etc/systemd/system/multi-user.target.wants 2>/dev/null || true")


def wait_until(predicate, timeout: float, what: str):
    return wait_for(predicate, timeout=timeout, what=what, every=0.2)


def _step(text: str) -> int:
    try:
        return int(json.loads(text).get("step") or 0)
    except ValueError:
        return 0


@pytest.fixture
def parent(remote, testbed):
    write_job(remote, 0.05)
    res = remote.cli("deploy", *CT, *SETS, "--wait=30")
    assert res.exit_code == 0, res.output
    wait_until(lambda: "ckpt-000030.txt" in ct_files(testbed), 60, "the parent's checkpoints")
    time.sleep(0.3)
    return remote


def test_a_slower_run_is_rolled_back_in_the_ct_and_a_crash_at_step_5_too(parent, testbed):
    before = ct_files(testbed)
    assert before.count("ckpt-") == 3, before
    write_job(parent, 0.1)
    res = parent.cli("deploy", *CT, *SETS, "--guard", "--yes", "--wait=90")
    assert res.exit_code == 1, res.output
    reg = parent.registry()
    assert reg.get(2).end_reason.startswith("rolled back: throughput ") and \
        reg.get(2).end_reason.endswith("of exp 1 over steps 2–20"), reg.get(2).end_reason
    assert reg.get(3).message == "restored from exp 1 after the guard of exp 2 failed"
    assert reg.get(3).revision == reg.get(1).revision and reg.get(3).status == "running"
    assert ct_files(testbed) == before
    log3 = f"{ROOT}/runs/{parent.run_key(3)}/train.log"
    wait_until(lambda: "resumed from" in ct_cat(testbed, log3), 20, "the restored run's first line")
    assert f"resumed from {CKPT}/ckpt-000030.txt at step 30" in ct_cat(testbed, log3)
    started = [json.loads(ct_cat(testbed, f"{ROOT}/runs/{parent.run_key(n)}/pid.json"))["started"] for n in (2, 3)]
    assert started[1] - started[0] < 20 * 0.1 + 5, started
    # experiment 3 is now the parent: a new run that crashes at step 5 is rolled back to it
    write_job(parent, 0.05, crash=5)
    res = parent.cli("deploy", *CT, *SETS, "--guard", "--yes", "--wait=90")
    assert res.exit_code == 1, res.output
    assert parent.registry().get(4).end_reason == "rolled back: crashed at step 5 (exit code 3)"
    assert parent.registry().get(5).message == "restored from exp 3 after the guard of exp 4 failed"
    assert ct_files(testbed) == before
    status = parent.cli("status", *CT)
    assert "experiment 5 running" in status.stdout, status.stdout


def test_a_faster_run_passes_in_the_ct_and_the_parents_checkpoints_stay_in_the_trash(parent, testbed):
    write_job(parent, 0.02)
    res = parent.cli("deploy", *CT, *SETS, "--guard", "--yes", "--wait=90")
    assert res.exit_code == 0 and "guard: passed after" in res.stdout, res.output
    assert "orch-resume-" not in units(testbed)  # the window's boot unit went with it ([run] resume_after_reboot off)
    trash = on_ct(testbed, 200, "sh", "-c", f"ls {CKPT}.trash/*-exp1")
    assert trash.split() == ["ckpt-000010.txt", "ckpt-000020.txt", "ckpt-000030.txt"], trash
    assert "guard: passed" in parent.cli("status", *CT).stdout


def test_the_ct_finishes_the_rollback_with_the_controller_killed(parent, testbed, tmp_path):
    before = ct_files(testbed)
    write_job(parent, 0.1)
    cli = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "deploy", *CT, *SETS, "--guard",
                            "--yes", "--wait=90"], cwd=parent.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    guard = f"{ROOT}/runs/{parent.run_key(2)}/guard.json"
    try:
        wait_until(lambda: _step(ct_cat(testbed, guard)) >= 3, 60, "the watch")
    finally:
        cli.kill()
        cli.wait()
    assert cli.returncode == -9  # killed during the watch, not ended by itself
    wait_until(lambda: '"rolled back"' in ct_cat(testbed, guard), 30, "the rollback, with no controller")
    shutil.copytree(parent.path, tmp_path / "clone")  # a clone with this registry
    other = RemoteProject(tmp_path / "clone", testbed)
    status = other.run("status", *CT)
    assert status.returncode == 0, status.stderr
    assert "experiment 3 running" in status.stdout and \
        "restored from exp 1 after the guard of exp 2 failed" in status.stdout, status.stdout
    assert other.registry().get(2).end_reason.startswith("rolled back: throughput ")
    assert ct_files(testbed) == before


@pytest.mark.parametrize("graceful", [False, True], ids=["lxc-stop -k", "lxc-stop"])
def test_a_ct_reboot_in_the_middle_of_a_rollback_ends_with_the_parent_back(parent, testbed, graceful):
    """The guard fails while the target's lock is held (the rollback waits for it), then the CT stops and starts
    again: the next status starts the rollback again, and the parent runs with its checkpoints as they were."""
    before = ct_files(testbed)
    write_job(parent, 0.1)
    res = parent.cli("deploy", *CT, *SETS[:-2], "--set", "guard.steps=60", "--guard", "--yes")
    assert res.exit_code == 0, res.output
    on_ct(testbed, 200, "sh", "-c", f"setsid flock {ROOT}/.lock sleep 300 </dev/null >/dev/null 2>&1 &")
    guard = f"{ROOT}/runs/{parent.run_key(2)}/guard.json"
    pid = f"{ROOT}/runs/{parent.run_key(2)}/guard.pid"
    wait_until(lambda: '"failed"' in ct_cat(testbed, guard), 60, "the guard's failure")
    wait_until(lambda: '"pid": null' not in ct_cat(testbed, pid) and '"pid"' in ct_cat(testbed, pid), 30,
               "the rollback, waiting for the lock")
    assert ct_files(testbed) != before  # the new run's: the parent's are still in the trash, and neither runs
    testbed.shutdown(200) if graceful else testbed.stop(200)
    testbed.start(200)
    first = parent.cli("status", *CT)
    assert first.exit_code == 0, first.output
    wait_until(lambda: '"rolled back"' in ct_cat(testbed, guard), 60, "the rollback after the reboot")
    status = parent.cli("status", *CT)
    assert "experiment 3 running" in status.stdout and \
        "restored from exp 1 after the guard of exp 2 failed" in status.stdout, status.stdout
    assert parent.registry().get(2).end_reason.startswith("rolled back: throughput ")
    assert ct_files(testbed) == before
    events = [json.loads(x)["event"] for x in ct_cat(testbed, f"{ROOT}/runs/{parent.run_key(2)}/guard.jsonl").splitlines()]
    assert events[0] == "failed" and events[-1] == "end"


@pytest.mark.parametrize("graceful", [False, True], ids=["lxc-stop -k", "lxc-stop"])
def test_a_stop_inside_the_guard_window_ends_with_the_parent_back_by_the_boot_alone(parent, testbed, graceful):
    """``lxc-stop -k`` (or a clean shutdown) before any verdict, then ``lxc-start``: the new run is lost, its guard
    fails as a crash's would, and its boot unit rolls back with no orch call; the parent's training runs, and
    status says so."""
    before = ct_files(testbed)
    write_job(parent, 0.1)
    res = parent.cli("deploy", *CT, *SETS[:-2], "--set", "guard.steps=100", "--guard", "--yes")
    assert res.exit_code == 0, res.output
    guard = f"{ROOT}/runs/{parent.run_key(2)}/guard.json"
    wait_until(lambda: _step(ct_cat(testbed, guard)) >= 3, 60, "the watch")
    assert "orch-resume-" in units(testbed)  # the window's, though [run] resume_after_reboot is off
    testbed.shutdown(200) if graceful else testbed.stop(200)
    testbed.start(200)
    wait_until(lambda: '"rolled back"' in ct_cat(testbed, guard), 60, "the rollback, started by the boot")
    assert "orch-resume-" not in units(testbed)
    assert "python3 job.py" in on_ct(testbed, 200, "ps", "-eo", "args")  # the parent's, put back
    status = parent.cli("status", *CT)
    assert "experiment 3 running" in status.stdout and \
        "restored from exp 1 after the guard of exp 2 failed" in status.stdout, status.stdout
    told = parent.cli("status", *CT, "-e", "2").stdout
    assert "experiment 2 lost (rolled back: lost at step " in told and "guard: step" not in told and \
        ("(interrupted by the container's shutdown)" if graceful else "(the container stopped)") + \
        "; rolled back (experiment 3)" in told, told
    assert parent.registry().get(2).end_reason.startswith("rolled back: lost at step ")
    assert ct_files(testbed) == before
