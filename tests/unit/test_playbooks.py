"""Playbooks: validated steps, a pure plan, and project playbooks overriding the built-in ones."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from orchestrator.cli.render import plan_lines
from orchestrator.launch import model, playbooks
from orchestrator.errors import ConfigError, InputError
from orchestrator.launch.model import Inputs
from tests.waits import wait_for

INPUTS = Inputs(target="local", root="/r", checkpoints="/r/ck", checkpoint_action="move", revision="abc", files=2,
                size=10, argv=["/bin/sh", "-c", "exec python3 t.py"], command="python3 t.py",
                batching={"strategy": "megabatch"})


def _book(tmp_path, steps: str):
    path = tmp_path / "deploy.yaml"
    path.write_text("name: deploy\nsteps:\n" + steps)
    return playbooks.load_file(path)


def test_builtin_playbooks_load_and_plan_typed_actions():
    for name in ("deploy", "restart", "stop"):
        book = playbooks.load(name, None)
        assert book.name == name
    actions = playbooks.plan(playbooks.load("deploy", None), INPUTS)
    assert [type(a) for a in actions] == [model.Preflight, model.Doctor, model.PushRevision, model.StopRun,
                                          model.Checkpoints, model.Record, model.StartRun, model.VerifyStarted]
    assert actions[2] == model.PushRevision(label="push_revision", revision="abc", files=2, size=10)
    assert actions[4] == model.Checkpoints(label="checkpoints", path="/r/ck", action="move")
    assert actions[5] == model.Record(label="record", target="local", parent=None)
    start = actions[6]
    assert start.command == "python3 t.py" and start.argv == ("/bin/sh", "-c", "exec python3 t.py")
    assert start.strategy == "megabatch" and start.nodes == 1
    assert model.checkpoint_action(actions) == "move"
    assert model.checkpoint_action(playbooks.plan(playbooks.load("stop", None), INPUTS)) == "keep"
    restart = playbooks.plan(playbooks.load("restart", None), INPUTS)
    assert [type(a) for a in restart[:2]] == [model.Preflight, model.Doctor]
    lines = plan_lines(actions)  # what --dry-run prints, from the actions
    assert lines[0].startswith("1. preflight: check python3 >= 3.10, tmux and 50 MB free under /r")
    assert lines[1].startswith("2. doctor: check the GPU driver and devices, /dev/shm, space and the clock")
    assert lines[4] == "5. checkpoints: move the contents of /r/ck to its trash (restorable)"
    assert lines[6] == ("7. start_run: start `python3 t.py` as /bin/sh -c 'exec python3 t.py' in tmux "
                        "(batching: megabatch)")
    with pytest.raises(InputError, match="there is none to push"):
        playbooks.plan(playbooks.load("deploy", None), Inputs(target="local", root="/r", checkpoints="/r/ck"))


def test_a_shell_step_runs_in_the_new_runs_work_folder_once_the_run_is_recorded(tmp_path):
    book = _book(tmp_path, "  - step: preflight\n  - step: shell\n    argv: [nvidia-smi, -L]\n    check: false\n"
                           "  - step: push_revision\n  - step: stop_run\n  - step: record\n"
                           "  - step: shell\n    name: gpus\n    argv: [sh, -c, 'nvidia-smi > gpu.txt']\n"
                           "  - step: shell\n    argv: [ls]\n    cwd: revision\n"
                           "  - step: start_run\n  - step: verify_started\n")
    actions = playbooks.plan(book, INPUTS)
    shells = [a for a in actions if isinstance(a, model.Shell)]
    assert [(a.label, a.cwd, a.check) for a in shells] == [("shell", "root", False), ("gpus", "work", True),
                                                            ("shell", "revision", True)]
    assert shells[1].argv == ("sh", "-c", "nvidia-smi > gpu.txt")
    assert [a.kind for a in actions].index("shell", 2) < [a.kind for a in actions].index("start_run")
    lines = plan_lines(actions)
    assert lines[1] == "2. shell: run nvidia-smi -L in the root folder (may fail)"
    assert lines[5] == "6. gpus: run sh -c 'nvidia-smi > gpu.txt' in the run's work folder"
    assert lines[6] == "7. shell: run ls in the revision folder"


def test_a_work_folder_step_before_the_run_is_recorded_is_refused(tmp_path):
    with pytest.raises(ConfigError) as err:
        _book(tmp_path, "  - step: shell\n    argv: [nvidia-smi]\n    cwd: work\n  - step: push_revision\n"
                        "  - step: record\n  - step: start_run\n")
    assert "step 1 (shell, cwd: work)" in err.value.message and "cwd: root" in err.value.hint
    with pytest.raises(ConfigError, match="after the record step"):  # recorded, but its revision comes later
        _book(tmp_path, "  - step: record\n  - step: shell\n    argv: [ls]\n    cwd: work\n"
                        "  - step: push_revision\n  - step: start_run\n")


def test_a_job_plans_the_same_actions_for_every_node(project, tmp_path):
    from orchestrator.config import load_settings
    from orchestrator.launch import multinode, prepare
    from orchestrator.reach.targets import resolve_target

    (project.path / "playbooks").mkdir()
    (project.path / "playbooks" / "deploy.yaml").write_text(
        "name: deploy\nsteps:\n  - step: preflight\n  - step: push_revision\n  - step: stop_run\n"
        "  - step: checkpoints\n  - step: record\n  - step: shell\n    argv: [sh, -c, 'nvidia-smi > gpu.txt']\n"
        "  - step: start_run\n  - step: verify_started\n")
    settings = load_settings(project.path / "orch.toml")
    local = resolve_target(settings, "local")
    other = replace(local, name="other", root=str(tmp_path / "other"), checkpoints=str(tmp_path / "other-ck"))
    launch = prepare.deploy(settings, local, message=None, clean=False, purge=False, yes=True, confirm=None,
                            echo=lambda _m: None, secret={})
    group = multinode.Group("pair", [local, other])
    shown = multinode.plan(launch, group)
    kinds = [a.kind for a in shown]
    assert kinds == ["preflight", "push_revision", "stop_run", "checkpoints", "record", "shell", "start_run",
                     "verify_started"]
    assert shown[4].target == "pair" and shown[5].nodes == 2 and shown[5].cwd == "work" and shown[6].nodes == 2
    lines = plan_lines(shown)
    assert lines[5] == "6. shell: run sh -c 'nvidia-smi > gpu.txt' in the run's work folder on every node"
    assert lines[6].endswith("on every node, node 0 first")
    nodes = multinode.prepare_nodes(launch, group)
    assert [[a.kind for a in n.launch.actions] for n in nodes] == [kinds, kinds]  # each node runs all of them
    assert [n.launch.actions[3].path for n in nodes] == [local.checkpoints, str(tmp_path / "other-ck")]
    assert [n.launch.actions[0].root for n in nodes] == [local.root, str(tmp_path / "other")]


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


def test_a_shell_step_before_the_start_writes_into_the_runs_work_folder(project):
    """``nvidia-smi > gpu.txt`` before the start: the file is in the run's work folder, where its command reads it."""
    (project.path / "playbooks").mkdir()
    (project.path / "playbooks" / "deploy.yaml").write_text(
        "name: deploy\nsteps:\n  - step: preflight\n  - step: push_revision\n  - step: stop_run\n"
        "  - step: checkpoints\n  - step: record\n"
        "  - step: shell\n"
        "    argv: [sh, -c, 'echo \"probed in $PWD for $ORCH_EXPERIMENT_ID\" > gpu.txt; echo probed']\n"
        "  - step: start_run\n  - step: verify_started\n")
    toml = project.path / "orch.toml"
    toml.write_text(toml.read_text().replace('command = "python3 train.py"', 'command = "cat gpu.txt"'))
    dry = project.cli("deploy", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "6. shell: run sh -c 'echo \"probed in $PWD for $ORCH_EXPERIMENT_ID\" > gpu.txt; echo probed' in the " \
           "run's work folder" in dry.stdout
    assert not (project.root / "runs").exists() or not any((project.root / "runs").iterdir())  # a dry run: nothing
    res = project.cli("deploy", "--wait=10")
    assert res.exit_code == 0, res.output
    assert "probed" in res.stdout
    work = project.run_dir(1) / "work"
    assert (work / "gpu.txt").read_text() == f"probed in {work} for 1\n"
    wait_for(lambda: "probed in" in (project.run_dir(1) / "train.log").read_text(), 20, "the probe's line")
    exp = project.registry().get(1)
    assert exp.status == "finished" and exp.exit_code == 0, exp
    assert not (project.root / "revisions" / exp.revision / "gpu.txt").exists()  # the revision stays as pushed
    assert not (project.root / "gpu.txt").exists()


def test_the_top_level_playbooks_folder_is_the_shipped_one():
    from tests.conftest import REPO

    top = REPO / "playbooks"
    assert top.is_dir() and top.resolve() == (REPO / "orchestrator" / "launch" / "builtin_playbooks").resolve()
    assert sorted(p.stem for p in top.glob("*.yaml")) == playbooks.builtin_names()
    for name in playbooks.builtin_names():
        assert playbooks.load_file(top / f"{name}.yaml") == playbooks.load(name, None)
