"""No phantom experiments: orch killed mid-deploy (SIGKILL, SIGTERM, SIGHUP) never leaves a row ``launching``.

Custom playbooks with a shell step that touches a marker and sleeps land the signal at a known point of
a real deploy on the local target; the real CLI runs as a subprocess.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli.test_workflow import wait_for

LOOP = """\
import os, time
print("exp=" + os.environ["ORCH_EXPERIMENT_ID"], flush=True)
while True:
    print("step=1 loss=1.0", flush=True)
    time.sleep(0.2)
"""


def book(project, name: str, steps: list[str], marker: Path) -> Path:
    """A playbook whose ``pause`` step touches ``marker`` and sleeps 3 s: the moment to send a signal."""
    pause = f'  - {{step: shell, argv: ["sh", "-c", "touch {marker}; sleep 3"]}}'
    lines = [f"name: {name}", "steps:"] + [pause if s == "pause" else f"  - step: {s}" for s in steps]
    path = project.path / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def configure(project) -> None:
    (project.path / "loop.py").write_text(LOOP)
    project.configure(lock_timeout=20)
    text = (project.path / "orch.toml").read_text()
    text = text.replace('sources = ["train.py"]', 'sources = ["loop.py", "big.bin"]')
    (project.path / "orch.toml").write_text(text.replace('command = "python3 train.py"',
                                                         'command = "python3 loop.py"'))
    (project.path / "big.bin").write_bytes(os.urandom(1 << 20))


def play(project, path: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "play", str(path)], cwd=project.path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def rows(project) -> dict:
    return {e.id: e for e in project.registry().list()}


def kill_at(project, path: Path, marker: Path | None, sig: int = signal.SIGKILL) -> subprocess.CompletedProcess:
    """Run the playbook; send ``sig`` once ``marker`` exists (or, without one, once the new row exists)."""
    before = len(rows(project)) if (project.path / ".orch" / "experiments.db").exists() else 0
    proc = play(project, path)
    if marker is not None:
        wait_for(marker.exists, what=f"{marker.name}")
    else:
        wait_for(lambda: (project.path / ".orch" / "experiments.db").exists() and len(rows(project)) > before,
                 timeout=60, what="the new row")
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=90)
    if marker is not None:
        marker.unlink()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def target_state(project, exp_id: int) -> str | None:
    """What the target's own files say about a run (None: the target never started it)."""
    run_dir = project.run_dir(exp_id)
    if not run_dir.exists() or {p.name for p in run_dir.iterdir()} <= {"journal.jsonl", "work"}:
        return None  # no folder, or only the journal of a launch that stopped before its start (and the work
        # folder a shell step before the start ran in)
    if (run_dir / "exit.json").exists():
        return "ended"
    return "running" if (run_dir / "pid.json").exists() else "launching"


def test_sigkill_at_any_point_of_a_deploy_leaves_no_phantom(project, tmp_path):
    configure(project)
    marker = tmp_path / "marker"
    after_record = book(project, "after-record", ["preflight", "push_revision", "record", "pause", "start_run",
                                                  "verify_started"], marker)
    during_push = book(project, "during-push", ["preflight", "record", "push_revision", "start_run",
                                                "verify_started"], marker)
    after_start = book(project, "after-start", ["preflight", "push_revision", "record", "start_run", "pause",
                                                "verify_started"], marker)
    assert kill_at(project, after_record, marker).returncode == -signal.SIGKILL
    assert rows(project)[1].status == "launching"
    (project.path / "big.bin").write_bytes(os.urandom(8 << 20))  # a new revision with a lot to push
    assert kill_at(project, during_push, None).returncode == -signal.SIGKILL
    assert kill_at(project, after_start, marker).returncode == -signal.SIGKILL
    # each play reached the target, so it settled the launch the previous kill left behind
    now = rows(project)
    assert now[1].status == "failed" and "launch interrupted" in now[1].error
    assert now[2].status == "failed" and now[3].status == "launching"
    listing = project.run("experiments", "list")
    assert "orphaned" in listing.stdout and "failed (interrupted)" in listing.stdout
    status = project.run("status", "--json")
    assert status.returncode == 0, status.stderr
    data = json.loads(status.stdout)
    assert data["experiment"] == 3 and data["state"] == "running"
    now = rows(project)
    assert [e.id for e in now.values() if e.status == "launching"] == []
    for exp_id, exp in now.items():
        on_target = target_state(project, exp_id)
        assert (exp.status, on_target) in (("failed", None), ("running", "running")), (exp_id, exp.status)
    assert not list((project.path / ".orch" / "launching").iterdir())
    # a phantom newer than the real run: logs and restart take the run that is there (a playbook that would
    # start a second run beside it is refused before its first step, so this one only records)
    only_record = book(project, "only-record", ["preflight", "push_revision", "record", "pause"], marker)
    assert kill_at(project, only_record, marker).returncode == -signal.SIGKILL
    logs = project.run("logs", "-n", "200")
    assert logs.returncode == 0, logs.stderr
    assert "exp=3" in logs.stdout
    assert rows(project)[4].status == "failed"
    restart = project.run("restart", "--json")
    assert restart.returncode == 0, restart.stderr
    assert json.loads(restart.stdout)["experiment"]["parent"] == 3
    assert project.run("stop").returncode == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_mark_the_row_before_orch_exits(project, tmp_path, sig):
    configure(project)
    marker = tmp_path / "marker"
    path = book(project, "slow", ["preflight", "push_revision", "record", "pause", "start_run", "verify_started"],
                marker)
    res = kill_at(project, path, marker, sig)
    name = signal.Signals(sig).name
    assert res.returncode == 128 + sig, res.stderr
    assert f"interrupted by {name}: " in res.stderr and "new run 1 not started" in res.stderr
    exp = project.registry().get(1)  # as orch left it: no other command has run
    assert exp.status == "failed" and exp.error == f"interrupted by {name} before it started"
    time.sleep(1.0)
    assert target_state(project, 1) is None
    assert not list((project.path / ".orch" / "launching").iterdir())


def test_a_run_of_another_machine_is_never_matched_to_a_row(project, tmp_path):
    """Run ids are per registry: another clone's run 1 on this target must not rewrite our row 1."""
    configure(project)
    (project.path / "big.bin").write_bytes(b"x")
    assert project.run("deploy").returncode == 0
    reg = project.registry()
    reg.update(1, machine="ssh:elsewhere:/workspace/orch", status="launching")
    status = project.run("status", "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["experiment"] is None
    exp = project.registry().get(1)
    assert exp.status == "launching"  # not ours to settle here; not theirs to take
    assert project.run("stop").returncode == 0


def test_a_start_cut_before_its_supervisor_came_up_never_sends_a_row_back_to_launching(project):
    """An agent killed between making the run folder and starting its supervisor leaves a folder with no pid: the
    target calls it ``launching`` for 30 s, then ``crashed``. The orch that launched it recorded ``failed`` (the
    target could not be asked); the next statuses keep that until the target knows, then record what it says."""
    configure(project)
    (project.path / "big.bin").write_bytes(b"x")
    assert project.run("deploy").returncode == 0
    assert project.run("stop").returncode == 0
    run_dir = project.run_dir(1)
    for name in ("pid.json", "exit.json"):
        (run_dir / name).unlink(missing_ok=True)
    launched = json.loads((run_dir / "launch.json").read_text())
    (run_dir / "launch.json").write_text(json.dumps(dict(launched, created=time.time())))
    error = "the connection was lost; the target could not be asked what was done"
    project.registry().update(1, status="failed", ended=time.time(), exit_code=None, error=error)
    for _ in range(2):  # every status, not only the first
        status = project.run("status")
        assert status.returncode == 0, status.stderr
        exp = project.registry().get(1)
        assert (exp.status, exp.error) == ("failed", error)
    (run_dir / "launch.json").write_text(json.dumps(dict(launched, created=time.time() - 31)))
    assert project.run("status").returncode == 0
    assert project.registry().get(1).status == "crashed"
