"""A deploy (and its dry run) whose command names a script the revision does not hold is refused before anything
changes on the target, with a hint that says how to send it or what to run (the real CLI, a real run on the local
target); a command orch cannot be sure of (a ``cd``, an absolute path, a ``$VAR``) is left to run."""

from __future__ import annotations

import json

import pytest


def _with_command(project, command: str, sources: str = '["train.py"]') -> None:
    config = project.path / "orch.toml"
    text = config.read_text().replace('command = "python3 train.py"', f"command = {json.dumps(command)}")
    config.write_text(text.replace('sources = ["train.py"]', f"sources = {sources}"))


def _refused(project, says: str, hint: str) -> None:
    for dry in (["--dry-run"], []):
        refused = project.run("deploy", "-m", "x", *dry)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert says in refused.stderr and f"hint: {hint}" in refused.stderr, refused.stderr
        assert "nothing was changed on the target" in refused.stderr
    if (project.path / ".orch" / "experiments.db").exists():
        with project.registry() as reg:
            assert reg.list() == []  # nothing recorded, running or otherwise
    assert not (project.root / "runs").exists() or not any((project.root / "runs").iterdir())


def test_a_script_outside_the_sources_is_refused_and_named(project):
    (project.path / "finetune.py").write_text("print('step=1 loss=1')\n")
    _with_command(project, "python3 -u finetune.py --lr 3e-4")
    _refused(project, "[project] command 'python3 -u finetune.py --lr 3e-4' runs finetune.py, which is not among "
             "the 1 file(s) of the revision", "add finetune.py to [project] sources in orch.toml")


def test_a_script_an_ignore_rule_leaves_out_is_refused_with_the_rule(project):
    (project.path / "scripts").mkdir()
    (project.path / "scripts" / "run.sh").write_text("exec python3 train.py\n")
    (project.path / ".gitignore").write_text("*.sh\n")
    _with_command(project, "bash scripts/run.sh", sources='["train.py", "scripts"]')
    _refused(project, "runs scripts/run.sh, which is not among", "scripts/run.sh is left out by .gitignore line 1: "
             "*.sh: the line !scripts/run.sh in .orchignore sends it")


def test_a_launcher_or_a_module_of_the_project_that_is_not_there_is_refused(project):
    (project.path / "tinylm").mkdir()
    (project.path / "tinylm" / "__init__.py").write_text("")
    _with_command(project, "torchrun --nproc_per_node 1 --standalone ddp.py", sources='["train.py", "tinylm"]')
    _refused(project, "runs ddp.py, which is not among", "set [project] command in orch.toml to what starts the "
             "training; found in the project: python3 train.py")
    project.configure()
    _with_command(project, "python3 -m tinylm.train", sources='["train.py", "tinylm"]')
    _refused(project, "runs tinylm/train.py, which is not among", "set [project] command in orch.toml")


def test_a_command_orch_cannot_be_sure_of_still_runs(project):
    (project.path / "sub").mkdir()
    (project.path / "sub" / "train.py").write_text((project.path / "train.py").read_text())
    _with_command(project, "cd sub && python3 train.py", sources='["sub"]')
    planned = project.run("deploy", "--dry-run")
    assert planned.returncode == 0, planned.stderr


@pytest.mark.parametrize("command, found", [
    ("python3 train.py", ("script", "train.py")),
    ("OMP_NUM_THREADS=1 python3 -u -W ignore ./src/../train.py --lr 1", ("script", "train.py")),
    (["python3", "-X", "dev", "a b.py"], ("script", "a b.py")),
    ("accelerate launch --config_file cfg.yaml --num_processes 2 finetune.py", ("script", "finetune.py")),
    ("deepspeed --num_gpus 2 train.py --deepspeed ds.json", ("script", "train.py")),
    ("bash -e run.sh", ("script", "run.sh")),
    ("./run.sh --fast", ("script", "run.sh")),
    ("python3 -m pkg.train", ("module", "pkg.train")),
    ("cd sub && python3 train.py", None),  # where it runs is decided by the shell
    ("python3 /opt/train.py", None),
    ("python3 $CODE/train.py", None),
    ("python3 ../train.py", None),
    ("python3 -c 'import train'", None),
    ("bash -c 'python3 train.py'", None),
    ("torchrun --module pkg.train", None),
    ("python3 train.py > out.log", None),
    ("make train", None),
])
def test_what_a_command_surely_runs(command, found):
    from orchestrator.launch.command import runs_file

    assert runs_file(command) == found


def test_a_module_is_checked_only_when_the_project_holds_its_package():
    from orchestrator.launch.command import missing

    files = {"train.py", "pkg/__init__.py", "pkg/model.py", "src/lib/__main__.py"}
    assert missing(("module", "pkg.train"), files, []) == "pkg/train.py"
    assert missing(("module", "pkg.model"), files, []) is None
    assert missing(("module", "torch.distributed.run"), files, []) is None  # installed on the target, maybe
    assert missing(("module", "lib"), files, ["src"]) is None  # src/lib/__main__.py, with PYTHONPATH=src
    assert missing(("script", "train.py"), files, []) is None


def test_a_restart_of_an_experiment_whose_revision_lacks_its_script_is_refused(project):
    """An experiment recorded by an orch that did not check (its run died on can't open file) is not relaunched."""
    assert project.run("deploy", "--wait", "60").returncode == 0
    with project.registry() as reg:  # as an older orch recorded it: the command names a file never sent
        reg.db.execute("UPDATE experiments SET command = ? WHERE id = 1", (json.dumps("python3 chargpt.py"),))
    refused = project.run("restart", "--yes")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "experiment 1's command 'python3 chargpt.py' runs chargpt.py, which its revision" in refused.stderr
    with project.registry() as reg:
        assert [e.id for e in reg.list()] == [1]
