"""The registry (``.orch/experiments.db``) under faults, with the real CLI on the local target: ids out of range,
a corrupt file, a lock another process holds, and a full disk under the project's ``.orch`` (a real tmpfs)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import hold_registry, tmux_socket, wait_for

QUIET = "import time\nprint('step=1 loss=1.0', flush=True)\nwhile True:\n    time.sleep(0.1)\n"
QUIET_FLAGS = ["--set", "project.sources=['quiet.py', 'train.py']", "--set", "project.command=python3 quiet.py"]
HUGE = "99999999999999999999"


def one_error(proc: subprocess.CompletedProcess) -> str:
    """The single ``error:`` line of a failed command that also gave a hint and no traceback."""
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "\nhint: " in proc.stderr, proc.stderr
    return errors[0]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_ids_out_of_range_are_input_errors_everywhere(project):
    assert project.run("experiments", "list").returncode == 0
    for args in (["experiments", "show", HUGE], ["logs", "-e", HUGE], ["experiments", "compare", "1", HUGE],
                 ["experiments", "plot", HUGE, "--out", "x.png"], ["experiments", "show", "-1"],
                 ["status", "--ct", HUGE], ["use", "--ct", HUGE], ["experiments", "list", "--limit", HUGE],
                 ["gc", "--keep", HUGE], ["logs", "-n", HUGE]):
        proc = project.run(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        line = one_error(proc)
        assert HUGE in line or "-1" in line or "greater than" in line or "less than" in line, line
    assert project.registry().list() == []


def test_a_corrupt_registry_is_said_and_left_untouched(project):
    db = project.path / ".orch" / "experiments.db"
    db.parent.mkdir()
    db.write_bytes(os.urandom(8192))
    before = digest(db)
    for args in (["status"], ["experiments", "list"], ["experiments", "show", "1"], ["deploy"]):
        proc = project.run(*args)
        assert proc.returncode == 1, (args, proc.stderr)
        assert "is corrupt" in one_error(proc) and str(db) in proc.stderr
        assert "orch experiments rebuild" in proc.stderr
    assert digest(db) == before and [p.name for p in db.parent.glob("experiments.db*")] == ["experiments.db"]
    assert not (project.root / "runs").exists() or not any((project.root / "runs").iterdir())


def test_a_locked_registry_is_waited_for_then_names_its_holder(project):
    (project.path / "quiet.py").write_text(QUIET)
    assert project.run("deploy", *QUIET_FLAGS).returncode == 0
    run_dir = project.run_dir(1)
    db = project.path / ".orch" / "experiments.db"
    holder = hold_registry(db)
    try:
        cli = [sys.executable, "-m", "orchestrator.cli.main"]
        started = time.monotonic()
        # at once: a deploy (whose new experiment cannot be recorded) and a stop (done on the target all the same),
        # each waiting 6 s for the lock (30 s by default)
        deploy = subprocess.Popen([*cli, "deploy", *QUIET_FLAGS, "--set", "run.registry_timeout=6"],
                                  cwd=project.path, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        stop = subprocess.Popen([*cli, "stop"], cwd=project.path, text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=dict(os.environ, ORCH_RUN__REGISTRY_TIMEOUT="6"))
        d_out, d_err = deploy.communicate(timeout=120)
        s_out, s_err = stop.communicate(timeout=120)
        waited = time.monotonic() - started
    finally:
        holder.kill()
        holder.wait()
    refused = subprocess.CompletedProcess(deploy.args, deploy.returncode, d_out, d_err)
    assert refused.returncode == 5, d_err
    assert f"locked by another process (pid {holder.pid}" in d_err and "waiting up to 6 s" in d_err
    line = one_error(refused)
    assert "stayed locked for 6 s" in line and f"pid {holder.pid}" in line, line
    assert f"kill {holder.pid}" in d_err
    assert waited >= 5.5
    assert stop.returncode == 0, s_err  # the run was stopped, and orch says so
    assert "experiment 1" in s_out and "stopped" in s_out
    assert "not recorded" in s_err and "the next command records it" in s_err
    assert (run_dir / "exit.json").exists() and not project.run_dir(2).exists()
    status = project.run("status", "--json")  # the holder gone: the next command records what the stop did
    assert status.returncode == 0 and json.loads(status.stdout)["state"] == "stopped", status.stderr
    with project.registry() as reg:
        assert [(e.id, e.status) for e in reg.list()] == [(1, "stopped")]
    bad = project.run("deploy", *QUIET_FLAGS, "--set", "run.registry_timeout=0")  # under a second: refused
    assert bad.returncode == 2 and "run.registry_timeout = 0" in one_error(bad) + bad.stderr, bad.stderr
    assert not project.run_dir(2).exists() and [e.id for e in project.registry().list()] == [1]


@pytest.fixture
def full_state(project):
    """The project's ``.orch`` folder on a 4 MB tmpfs of its own."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    state = project.path / ".orch"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0755", "tmpfs", str(state)], check=True)
    yield state
    subprocess.run(["tmux", "-L", tmux_socket(str(project.root)), "kill-server"], capture_output=True)
    if subprocess.run(["umount", str(state)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(state)], capture_output=True)
        pytest.fail(f"{state} was busy at teardown")


def fill(folder: Path) -> Path:
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as fh:
        for size in (1 << 20, 4096, 1):
            try:
                while True:
                    fh.write(b"\0" * size)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    assert os.statvfs(folder).f_bavail == 0
    return filler


def test_a_full_controller_disk_still_allows_status_and_stop(project, full_state):
    (project.path / "quiet.py").write_text(QUIET)
    first = project.run("deploy", *QUIET_FLAGS)
    assert first.returncode == 0, first.stderr
    run_dir = project.run_dir(1)
    filler = fill(full_state)

    status = project.run("status", "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["state"] == "running"
    assert "no space left" in status.stderr and f"0 bytes free on {full_state}" in status.stderr
    assert "Traceback" not in status.stderr and "disk I/O error" not in status.stderr

    refused = project.run("deploy", *QUIET_FLAGS)
    assert refused.returncode == 1
    line = one_error(refused)
    assert "no space left" in line and "bytes free" in line and str(full_state) in line, line
    assert "nothing was changed on the target" in refused.stderr
    assert not project.run_dir(2).exists()
    assert not (run_dir / "exit.json").exists()  # the running experiment was left alone

    stop = project.run("stop")
    assert stop.returncode == 0, stop.stderr
    assert "stopped" in stop.stdout and "no space left" in stop.stderr
    wait_for(lambda: (run_dir / "exit.json").exists(), timeout=10, what="the run's exit record")
    assert project.run("experiments", "list").returncode == 0

    filler.unlink()  # room again: the next command records what the stop did
    after = project.run("status", "--json")
    assert after.returncode == 0, after.stderr
    assert json.loads(after.stdout)["state"] == "stopped"
    assert "no space left" not in after.stderr
    with project.registry() as reg:
        assert reg.get(1).status == "stopped" and reg.get(1).ended is not None
