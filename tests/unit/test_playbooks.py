"""Playbooks: validated steps, a pure plan, and project playbooks overriding the built-in ones."""

from __future__ import annotations

import json
import time

import pytest

from orchestrator.launch import playbooks
from orchestrator.errors import ConfigError
from orchestrator.launch.playbooks import Inputs


def test_builtin_playbooks_load_and_plan():
    for name in ("deploy", "restart", "stop"):
        book = playbooks.load(name, None)
        assert book.name == name
    book = playbooks.load("deploy", None)
    inputs = Inputs(target="local", root="/r", checkpoints="/r/ck",
                    checkpoint_action="move", revision="abc", files=2, size=10, argv=["python3", "t.py"],
                    batching={"strategy": "megabatch"})
    lines = playbooks.plan(book, inputs)
    assert lines[0].startswith("1. preflight") and "move the contents of /r/ck" in lines[3]
    assert "python3 t.py" in lines[5]


@pytest.mark.parametrize("text, message", [
    ("name: x\nsteps:\n  - step: launch_rockets\n", "does not match any of the expected tags"),
    ("name: x\nsteps:\n  - step: shell\n    argv: 'rm -rf /'\n", "valid list"),
    ("name: x\nsteps:\n  - step: start_run\n", "start_run needs a record step"),
    ("name: x\nsteps: []\n", "at least 1 item"),
    ("name: x\nsteps: [\n", "not valid YAML"),
])
def test_invalid_playbooks_are_refused(tmp_path, text, message):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        playbooks.load_file(path)
    assert message in err.value.message


def test_project_playbook_overrides_builtin_and_runs_a_shell_step(project):
    (project.path / "playbooks").mkdir()
    (project.path / "playbooks" / "deploy.yaml").write_text(
        "name: deploy\nsteps:\n  - step: preflight\n  - step: push_revision\n"
        "  - step: shell\n    argv: [python3, -c, \"import sys; print('hello from', sys.argv[1])\", target]\n"
        "  - step: stop_run\n  - step: checkpoints\n  - step: record\n  - step: start_run\n"
        "  - step: verify_started\n")
    dry = project.cli("deploy", "--dry-run")
    assert "3. shell: run python3 -c" in dry.stdout
    res = project.cli("deploy")
    assert res.exit_code == 0, res.output
    assert "hello from target" in res.stdout


def test_play_runs_any_playbook_and_a_failing_shell_step_stops_it(project, tmp_path):
    book = tmp_path / "check.yaml"
    book.write_text("name: check\nsteps:\n  - step: preflight\n  - step: shell\n    argv: [python3, -c, 'exit(4)']\n"
                    "  - step: shell\n    argv: [touch, should-not-exist]\n")
    res = project.cli("play", str(book))
    assert res.exit_code == 4 and "exited with 4" in res.output
    assert not (project.root / "should-not-exist").exists()
    assert project.registry().list() == []


def test_init_playbooks_writes_editable_copies_and_never_clobbers_them(project):
    (project.path / "orch.toml").rename(project.path / "keep.toml")
    res = project.cli("init", "--playbooks")
    assert res.exit_code == 0, res.output
    copies = project.path / "playbooks"
    assert sorted(p.name for p in copies.iterdir()) == ["deploy.yaml", "restart.yaml", "stop.yaml"]
    assert playbooks.load_file(copies / "deploy.yaml") == playbooks.load("deploy", None)
    (copies / "stop.yaml").write_text("name: stop\nsteps:\n  - step: stop_run\n    name: mine\n")
    again = project.cli("init", "--playbooks")
    assert again.exit_code == 2 and "already exist" in again.output and "--force" in again.output
    assert "mine" in (copies / "stop.yaml").read_text()
    assert playbooks.load("stop", project.path).steps[0].name == "mine"
    toml = (project.path / "orch.toml").read_text()
    assert project.cli("init", "--playbooks", "--force").exit_code == 0
    assert "mine" not in (copies / "stop.yaml").read_text()
    assert (project.path / "orch.toml").read_text() == toml  # --force with --playbooks leaves orch.toml alone


def test_version_comes_from_the_installed_distribution(project):
    from importlib import metadata

    res = project.cli("--version")
    assert res.exit_code == 0 and res.stdout == f"orch {metadata.version('orch')}\n"
