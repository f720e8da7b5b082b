"""``deploy --guard`` on the local target, with the real CLI: the new run is watched by its own supervisor
against the run it replaced, and put back by the target when it is worse."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import Project, snapshot, wait_for

# A training script at a steady pace: one step per SLEEP s, tok_s measured by itself, a checkpoint every 10 steps
# up to step CKPT_UNTIL; it resumes from ORCH_RESUME_FROM.
JOB = """\
import os, sys, time
SLEEP, CRASH_AT, CKPT_UNTIL = {sleep}, {crash}, 30
ck = os.environ["ORCH_CHECKPOINT_DIR"]
step = 0
resume = os.environ.get("ORCH_RESUME_FROM")
if resume:
    step = int(open(resume).read().split()[0])
    print(f"resumed from {{resume}} at step {{step}}", flush=True)
last = time.monotonic()
while True:
    step += 1
    time.sleep(SLEEP)
    now = time.monotonic()
    print(f"step={{step}} loss={{2.0 + 1 / step:.4f}} tok_s={{1000 / (now - last):.0f}}", flush=True)
    last = now
    if step == CRASH_AT:
        sys.exit(3)
    if step % 10 == 0 and step <= CKPT_UNTIL:
        tmp = os.path.join(ck, f".ckpt-{{step}}.tmp")
        with open(tmp, "w") as fh:
            fh.write(f"{{step}} written by experiment {{os.environ['ORCH_EXPERIMENT_ID']}}")
        os.replace(tmp, os.path.join(ck, f"ckpt-{{step:06d}}.txt"))
"""
SETS = ["--set", "project.sources=['job.py']", "--set", "project.command=python3 job.py",
        "--set", "guard.steps=20"]


def write_job(p: Project, sleep: float, crash: int = 0, loss: float = 2.0) -> None:
    (p.path / "job.py").write_text(JOB.format(sleep=sleep, crash=crash).replace("2.0 + 1 / step", f"{loss} + 1 / step"))


def guard_state(p: Project, exp_id: int) -> dict:
    try:
        return json.loads((p.run_dir(exp_id) / "guard.json").read_text())
    except (OSError, ValueError):
        return {}


@pytest.fixture
def parent(project):
    """Experiment 1 at 20 steps/s (1000 tok/s per step of 50 ms), its checkpoints written up to step 30."""
    project.configure(lock_timeout=30)
    write_job(project, 0.05)
    res = project.run("deploy", *SETS, "--wait=20")
    assert res.returncode == 0, res.stdout + res.stderr
    wait_for(lambda: (project.checkpoints / "ckpt-000030.txt").exists(), 30, "the parent's checkpoints")
    time.sleep(0.3)
    return project


def restored_log(p: Project, exp_id: int) -> str:
    return (p.run_dir(exp_id) / "train.log").read_text()


def test_a_slower_new_run_is_rolled_back_to_its_parent(parent):
    before = snapshot(parent.checkpoints)
    assert sorted(Path(k).name for k in before) == ["ckpt-000010.txt", "ckpt-000020.txt", "ckpt-000030.txt"]
    write_job(parent, 0.1)  # half as fast
    begin = time.monotonic()
    res = parent.run("deploy", *SETS, "--guard", "--yes", "--wait=60")
    took = time.monotonic() - begin
    assert res.returncode == 1, res.stdout + res.stderr
    assert "error: the guard of experiment 2 failed on local: rolled back: throughput" in res.stderr, res.stderr
    assert took < 60, took
    # from the new run's start to the restored run's: the window (20 steps of 0.1 s) and a few seconds
    started = [json.loads((parent.run_dir(n) / "pid.json").read_text())["started"] for n in (2, 3)]
    assert started[1] - started[0] < 20 * 0.1 + 5, started
    reg = parent.registry()
    failed, restored, first = reg.get(2), reg.get(3), reg.get(1)
    assert failed.status == "stopped"
    assert failed.end_reason.startswith("rolled back: throughput ") and "Ktok/s < 0.9 × " in failed.end_reason
    assert failed.end_reason.endswith("Ktok/s of exp 1 over steps 2–20"), failed.end_reason
    assert restored.message == "restored from exp 1 after the guard of exp 2 failed"
    assert restored.status == "running" and restored.revision == first.revision and restored.parent == 1
    # the parent's checkpoints are back exactly as they were, and the restored run resumed from the newest
    assert snapshot(parent.checkpoints) == before
    wait_for(lambda: "resumed from" in restored_log(parent, 3), 10, "the restored run's first line")
    assert f"resumed from {parent.checkpoints}/ckpt-000030.txt at step 30" in restored_log(parent, 3)
    # the failed run's own checkpoints are in the trash, named after it
    trash = Path(str(parent.checkpoints) + ".trash")
    mine = [e for e in trash.iterdir() if e.name.endswith("-exp2")]
    assert len(mine) == 1
    # its window's two, and the third where a loaded machine let it reach step 30 before the rollback stopped it
    theirs = sorted(p for p in mine[0].iterdir() if p.name.startswith("ckpt"))
    assert [p.name for p in theirs][:2] == ["ckpt-000010.txt", "ckpt-000020.txt"] and len(theirs) <= 3, theirs
    assert all(p.read_text().endswith("written by experiment 2") for p in theirs), [p.read_text() for p in theirs]
    status = parent.run("status")
    assert status.returncode == 0, status.stderr
    assert "experiment 3 running" in status.stdout and \
        "message: restored from exp 1 after the guard of exp 2 failed" in status.stdout, status.stdout
    shown = parent.run("experiments", "show", "2")
    assert "rolled back: throughput" in shown.stdout, shown.stdout


def test_a_new_run_that_crashes_at_step_5_is_rolled_back(parent):
    before = snapshot(parent.checkpoints)
    write_job(parent, 0.05, crash=5)
    res = parent.run("deploy", *SETS, "--guard", "--yes", "--wait=60")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "error: the guard of experiment 2 failed on local: rolled back: crashed at step 5 (exit code 3)" in \
        res.stderr and "hint: experiment 3 runs the parent again" in res.stderr, res.stderr
    reg = parent.registry()
    assert reg.get(2).end_reason == "rolled back: crashed at step 5 (exit code 3)", reg.get(2).end_reason
    assert reg.get(3).message == "restored from exp 1 after the guard of exp 2 failed"
    assert snapshot(parent.checkpoints) == before
    assert reg.get(3).status == "running"


def test_a_faster_new_run_passes_and_the_parents_checkpoints_stay_in_the_trash(parent):
    before = {Path(k).name: v for k, v in snapshot(parent.checkpoints).items()}
    write_job(parent, 0.02)
    res = parent.run("deploy", *SETS, "--guard", "--yes", "--wait=60")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "guard: passed after" in res.stdout, res.stdout
    status = parent.run("status")
    assert "experiment 2 running" in status.stdout and "guard: passed (throughput " in status.stdout, status.stdout
    assert guard_state(parent, 2)["state"] == "passed"
    assert not parent.run_dir(3).exists() and [e.id for e in parent.registry().list()] == [1, 2] or \
        sorted(e.id for e in parent.registry().list()) == [1, 2]
    trash = Path(str(parent.checkpoints) + ".trash")
    (entry,) = [e for e in trash.iterdir() if e.name.endswith("-exp1")]
    assert {p.name: p.read_bytes() for p in entry.iterdir() if p.name.startswith("ckpt")} == before


def test_status_shows_the_guard_while_it_watches(parent):
    write_job(parent, 0.05)
    res = parent.run("deploy", *SETS[:-2], "--set", "guard.steps=100000", "--guard", "--yes")
    assert res.returncode == 0, res.stdout + res.stderr
    wait_for(lambda: guard_state(parent, 2).get("step", 0) >= 5, 20, "the guard's progress")
    status = parent.run("status")
    assert "  guard: step " in status.stdout and "/100000, throughput " in status.stdout and "× parent" in \
        status.stdout, status.stdout
    # stopped by hand, the watched run ends its watch: no rollback starts the parent again (nor outlives the test)
    assert parent.run("stop").returncode == 0
    time.sleep(2)
    assert sorted(e.id for e in parent.registry().list()) == [1, 2]
    assert parent.registry().get(2).status == "stopped"


def test_the_target_finishes_the_rollback_with_the_controller_killed_and_its_own_process_cut(parent, tmp_path):
    """The controller is SIGKILLed during the watch; the target's rollback waits for the lock (held here), is
    killed too, and the next status, from another clone of this registry, starts it again and tells the story."""
    before = snapshot(parent.checkpoints)
    write_job(parent, 0.1)
    fd = os.open(parent.root / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    cli = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "deploy", *SETS, "--guard", "--yes",
                            "--wait=60"], cwd=parent.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: guard_state(parent, 2).get("step", 0) >= 3, 30, "the watch")
        fcntl.flock(fd, fcntl.LOCK_EX)  # the rollback will wait for the target's lock
        cli.kill()
        cli.wait()
        pid_file = parent.run_dir(2) / "guard.pid"
        wait_for(lambda: pid_file.exists() and json.loads(pid_file.read_text()).get("pid"), 20, "the rollback")
        os.kill(json.loads(pid_file.read_text())["pid"], signal.SIGKILL)
        time.sleep(0.2)
        assert guard_state(parent, 2)["state"] == "failed"
        assert not (parent.run_dir(3)).exists()  # neither run: the next command finishes it
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    other = Project(tmp_path / "clone", parent.root)
    shutil.copytree(parent.path, other.path)  # a clone with this registry
    first = other.run("status")
    assert first.returncode == 0, first.stderr
    wait_for(lambda: guard_state(parent, 2).get("state") == "rolled back", 20, "the rollback, started again")
    status = other.run("status")
    assert "experiment 3 running" in status.stdout and \
        "restored from exp 1 after the guard of exp 2 failed" in status.stdout, status.stdout
    assert other.registry().get(2).end_reason.startswith("rolled back: throughput ")
    assert snapshot(parent.checkpoints) == before
    steps = [json.loads(line)["event"] for line in (parent.run_dir(2) / "guard.jsonl").read_text().splitlines()]
    assert steps[0] == "failed" and steps[-1] == "end" and steps.count("begin") == 1


def test_bad_guard_settings_and_a_guard_with_nothing_to_compare_are_refused(project):
    project.configure()
    write_job(project, 0.05)
    bad = project.run("deploy", *SETS, "--set", "guard.on_fail=undo", "--guard", "--yes")
    assert bad.returncode == 2 and "on_fail" in bad.stderr and "hint:" in bad.stderr, bad.stderr
    none = project.run("deploy", *SETS, "--guard", "--yes")
    assert none.returncode == 2, none.stdout + none.stderr
    assert "error: --guard compares the new run with the one it replaces" in none.stderr and "hint:" in none.stderr
    assert project.registry().list() == [] and not (project.root / "runs").exists() or \
        not any((project.root / "runs").iterdir())


def test_restart_guard_with_on_fail_stop_stops_the_new_run_and_leaves_the_parent_stopped(parent):
    """``restart --guard`` relaunches the parent's own revision; a crash fails the guard, and ``stop`` puts nothing
    back: the new run is stopped, its end says why, and no experiment is started."""
    res = parent.run("restart", "--guard", "--yes", "--wait=60", "--set", "guard.on_fail=stop",
                     env={"ORCH_GUARD__STEPS": "100000"})
    assert res.returncode == 2 and "--set" in res.stderr  # restart takes no --set: the parent's settings
    (parent.path / "orch.toml").write_text((parent.path / "orch.toml").read_text() +
                                           '\n[guard]\nsteps = 20\non_fail = "stop"\nmin_throughput = 50\n')
    res = parent.run("restart", "--guard", "--yes", "--wait=60")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "error: the guard of experiment 2 failed on local: guard failed: throughput" in res.stderr and \
        "hint: orch logs -e 2" in res.stderr, res.stderr
    reg = parent.registry()
    assert reg.get(2).revision == reg.get(1).revision
    assert reg.get(2).status == "stopped" and reg.get(2).end_reason.startswith("guard failed: throughput ") and \
        reg.get(2).end_reason.endswith('; stopped ([guard] on_fail = "stop")'), reg.get(2).end_reason
    time.sleep(1.0)
    assert sorted(e.id for e in parent.registry().list()) == [1, 2] and not parent.run_dir(3).exists()
    assert "experiment 2 stopped" in parent.run("status").stdout


def test_a_new_run_that_stalls_is_rolled_back(parent):
    (parent.path / "job.py").write_text("import time\nfor s in range(1, 4):\n    print(f'step={s} loss=2.0 tok_s=900',"
                                        " flush=True)\n    time.sleep(0.05)\ntime.sleep(600)\n")
    res = parent.run("deploy", *SETS, "--set", "run.stall_after=1", "--guard", "--yes", "--wait=60")
    assert res.returncode == 1, res.stdout + res.stderr
    assert parent.registry().get(2).end_reason == "rolled back: stalled at step 3", parent.registry().get(2).end_reason
    assert parent.registry().get(3).status == "running"


def test_a_guard_over_another_clones_run_is_refused(parent, tmp_path):
    other = Project(tmp_path / "clone", parent.root)
    shutil.copytree(parent.path, other.path, ignore=shutil.ignore_patterns(".orch"))  # a registry of its own
    res = other.run("deploy", *SETS, "--guard", "--yes")
    assert res.returncode == 2 and "another clone of this project started" in res.stderr and "hint:" in res.stderr
    assert parent.registry().get(1).status == "running" and other.registry().list() == []


def test_a_new_run_with_a_worse_loss_at_the_same_steps_is_rolled_back(parent):
    write_job(parent, 0.05, loss=3.0)  # as fast, but its loss is half as high again
    res = parent.run("deploy", *SETS, "--set", "guard.max_loss_ratio=1.2", "--guard", "--yes", "--wait=60")
    assert res.returncode == 1, res.stdout + res.stderr
    reason = parent.registry().get(2).end_reason
    assert reason.startswith("rolled back: loss 3.") and " > 1.2 × 2." in reason and \
        reason.endswith(" of exp 1 over steps 2–20"), reason
    assert parent.registry().get(3).status == "running"


def test_a_new_run_lost_inside_the_window_fails_its_guard_and_the_next_status_puts_the_parent_back(parent):
    """The new run and its supervisor are killed before any verdict, as a container's hard stop does: the next
    status fails the guard (lost, as a crash is) and rolls back; no stale progress is shown on the way."""
    before = snapshot(parent.checkpoints)
    write_job(parent, 0.1)
    res = parent.run("deploy", *SETS[:-2], "--set", "guard.steps=100000", "--guard", "--yes")
    assert res.returncode == 0, res.stdout + res.stderr
    wait_for(lambda: guard_state(parent, 2).get("step", 0) >= 3, 20, "the guard's progress")
    pid = json.loads((parent.run_dir(2) / "pid.json").read_text())
    os.kill(pid["supervisor"], signal.SIGKILL)  # first, so that nothing records the command's end
    os.killpg(pid["child"], signal.SIGKILL)
    wait_for(lambda: not os.path.exists(f"/proc/{pid['child']}"), 10, "the new run's end")
    first = parent.run("status", "-e", "2")
    assert first.returncode == 0, first.stderr
    assert "experiment 2 lost" in first.stdout and "guard: step" not in first.stdout, first.stdout
    assert "guard: failed: lost at step " in first.stdout and "(its supervisor was killed); rolling back" in \
        first.stdout, first.stdout
    wait_for(lambda: guard_state(parent, 2).get("state") == "rolled back", 20, "the rollback")
    status = parent.run("status")
    assert "experiment 3 running" in status.stdout and \
        "message: restored from exp 1 after the guard of exp 2 failed" in status.stdout, status.stdout
    told = parent.run("status", "-e", "2").stdout
    assert "experiment 2 lost (rolled back: lost at step " in told and \
        "(its supervisor was killed); rolled back (experiment 3)" in told, told
    assert parent.registry().get(2).end_reason.startswith("rolled back: lost at step "), \
        parent.registry().get(2).end_reason
    assert snapshot(parent.checkpoints) == before
    wait_for(lambda: "resumed from" in restored_log(parent, 3), 10, "the restored run's first line")
    child = json.loads((parent.run_dir(3) / "pid.json").read_text())["child"]
    os.kill(child, 0)  # the parent's training runs again
    events = [json.loads(line)["event"] for line in (parent.run_dir(2) / "guard.jsonl").read_text().splitlines()]
    assert events[0] == "failed" and events.count("failed") == 1 and events[-1] == "end", events
