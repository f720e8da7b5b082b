"""Bad input, dry runs and races: a clear error, a non-zero exit, and nothing changed."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import snapshot


def state(project) -> tuple[dict, list]:
    rows = [e.model_dump() for e in project.registry().list()] if (project.path / ".orch").exists() else []
    return snapshot(project.root), rows


def test_dry_run_changes_nothing(project):
    from tests.cli.test_standby import standby_ready

    project.configure(steps=100000, sleep=0.01)
    assert project.cli("deploy").exit_code == 0
    standby_ready(project)  # the next start's supervisor, which the start leaves coming up: it writes its record
    before = state(project)
    for args in (("deploy", "--dry-run"), ("deploy", "--dry-run", "--clean-checkpoints"),
                 ("restart", "--dry-run", "--clean-checkpoints", "--purge"), ("stop", "--dry-run")):
        res = project.cli(*args)
        assert res.exit_code == 0, res.output
        assert "dry run" in res.stdout
    plan = json.loads(project.cli("deploy", "--dry-run", "--json").stdout)
    assert [s.split(":")[0] for s in plan["steps"]] == ["1. preflight", "2. doctor", "3. push_revision",
                                                        "4. stop_run", "5. checkpoints", "6. record",
                                                        "7. start_run", "8. verify_started"]
    time.sleep(0.5)
    after_files, after_rows = state(project)
    before_files, before_rows = before
    # the running experiment's own log and checkpoints keep growing; everything orch owns is unchanged
    owned = lambda files: {k: v for k, v in files.items() if "/runs/" not in k and "/checkpoints" not in k}
    assert owned(after_files) == owned(before_files)
    assert after_rows == before_rows
    assert project.registry().get(1).status == "running"


@pytest.mark.parametrize("args, message", [
    (("deploy", "--target", "nowhere"), "unknown target 'nowhere'"),
    (("deploy", "--set", "batching.colour=red"), "unknown key 'batching.colour'"),
    (("deploy", "--set", "batching.strategy=fastest"), "Input should be 'sorted', 'shuffle', 'bucketed' or"),
    (("deploy", "--set", "batching.token_budget=100"), "must be at least max_seq_len"),
    (("deploy", "--set", "project.sources=['train.py', 'missing.py']"), "'missing.py' listed in [project] sources"),
    (("deploy", "--set", "nokey"), "needs the form section.key=value"),
    (("experiments", "show", "42"), "no experiment 42"),
    (("restart",), "nothing to restart"),
])
def test_bad_input_is_refused_cleanly(project, args, message):
    before = state(project)
    res = project.cli(*args)
    assert res.exit_code in (2, 7), res.output
    assert message in res.output
    assert "Traceback" not in res.output
    assert "error:" in res.output and "hint:" in res.output
    assert state(project) == before


def _set_checkpoints(project, path: str) -> None:
    text = (project.path / "orch.toml").read_text()
    text = text.replace(f'checkpoints = "{project.root}/checkpoints"', f'checkpoints = "{path}"')
    (project.path / "orch.toml").write_text(text)


@pytest.mark.parametrize("path", ["/", "/etc", "/usr", "/usr/lib", "/root"])
def test_system_checkpoint_folders_are_refused(project, path):
    _set_checkpoints(project, path)
    before = state(project)
    for args in (("deploy",), ("deploy", "--clean-checkpoints", "--yes"), ("checkpoints", "clean", "--yes")):
        res = project.cli(*args)
        assert res.exit_code == 6, res.output
        assert "system folder" in res.output and "hint:" in res.output
    files, rows = state(project)
    assert rows == before[1] == []
    assert not (project.root / "runs").exists() or not any((project.root / "runs").iterdir())


def test_checkpoint_folder_behind_an_escaping_symlink_is_refused(project, tmp_path):
    elsewhere = tmp_path / "precious"
    elsewhere.mkdir()
    (elsewhere / "model.pt").write_bytes(b"do not move me")
    project.root.mkdir(parents=True)
    link = project.root / "ckpt-link"
    link.symlink_to(elsewhere)
    _set_checkpoints(project, str(link))
    res = project.cli("deploy", "--clean-checkpoints", "--yes")
    assert res.exit_code == 6 and "symlink" in res.output
    res = project.cli("checkpoints", "clean", "--yes")
    assert res.exit_code == 6
    assert (elsewhere / "model.pt").read_bytes() == b"do not move me"
    assert project.registry().list() == []


def test_checkpoints_in_use_by_another_project_are_refused(project, tmp_path):
    project.configure(steps=100000, sleep=0.01)
    assert project.cli("deploy").exit_code == 0
    deadline = time.monotonic() + 30
    while not list(project.checkpoints.glob("ckpt-*")):
        assert time.monotonic() < deadline, "the run wrote no checkpoint"
        time.sleep(0.1)
    res = project.cli("checkpoints", "clean", "--yes")
    assert res.exit_code == 5 and "is running and writes to" in res.output
    assert project.registry().get(1).status == "running"


def test_a_held_target_lock_refuses_a_deploy_and_leaves_no_trace(project):
    project.configure(lock_timeout=0.5)
    project.root.mkdir(parents=True)
    fd = os.open(project.root / ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        res = project.cli("deploy")
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    assert res.exit_code == 5 and "busy" in res.output
    exp = project.registry().get(1)
    assert exp.status == "failed" and "busy" in (exp.error or "")
    assert not (project.run_dir(1)).exists()
    assert not any((project.root / "revisions").iterdir())
    ok = project.cli("deploy")
    assert ok.exit_code == 0, ok.output
    assert project.registry().get(2).status in ("running", "finished")


def test_two_concurrent_deploys_serialize(project):
    project.configure(steps=100000, sleep=0.01, lock_timeout=30)
    procs = [subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "deploy", "--json", "-m", f"d{i}"],
                              cwd=project.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    rows = sorted(project.registry().list(), key=lambda e: e.id)
    assert [e.id for e in rows] == [1, 2]
    assert "launching" not in [e.status for e in rows]
    # one waited for the other, then replaced it: exactly one runs now
    st = json.loads(project.cli("status", "--json").stdout)
    statuses = sorted(e.status for e in project.registry().list())
    assert statuses == ["running", "stopped"], statuses
    assert st["state"] == "running"
    for e in rows:
        assert (project.run_dir(e.id) / "experiment.json").is_file()
    assert project.cli("stop").exit_code == 0


def test_an_agent_failure_is_one_line_and_verbose_adds_its_traceback(project, monkeypatch):
    from orchestrator.reach.agent_client import AgentClient
    from orchestrator.errors import AgentError

    def broken(self, ops, **kwargs):
        raise AgentError("agent failure in status: KeyError('runs')", hint="rerun with --verbose to see the "
                         "agent's traceback", detail="Traceback (most recent call last):\nKeyError: 'runs'\n")

    monkeypatch.setattr(AgentClient, "call", broken)
    quiet = project.cli("status")
    assert quiet.exit_code == 4 and "Traceback" not in quiet.output
    assert quiet.output.splitlines()[0] == "error: agent failure in status: KeyError('runs')"
    loud = project.cli("--verbose", "status")
    assert loud.exit_code == 4 and "Traceback (most recent call last):\nKeyError: 'runs'" in loud.output
