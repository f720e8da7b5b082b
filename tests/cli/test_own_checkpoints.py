"""A command on experiment N acts on N's own checkpoints, on the local target (real CLI, tmux, agent, registry).

``restart -e N`` cleans and resumes from the folder N ran with (a ``--set paths.checkpoints`` one too), not the one
orch.toml names today, and the new run's record agrees with its config; ``checkpoints list -e N`` lists that
folder; ``pull -e N --checkpoints`` brings the files N wrote, from N's folder or from the trash entry a restart
moved them to, and never another experiment's under N's name.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import wait_for

TRAIN = """\
import os, signal, sys, time
ckpt, exp = os.environ["ORCH_CHECKPOINT_DIR"], os.environ["ORCH_EXPERIMENT_ID"]
os.makedirs(ckpt, exist_ok=True)
with open(os.path.join(ckpt, "last.ckpt"), "w") as fh:
    fh.write(f"weights of experiment {int(exp):04d}")
with open(os.path.join(ckpt, f"only-exp{exp}.bin"), "w") as fh:
    fh.write(exp)
signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
while True:
    print("step=1 loss=1.0", flush=True)
    time.sleep(0.2)
"""


@pytest.fixture
def own(project):
    """The project with no checkpoint folder of the target's own: ``[paths] checkpoints`` (or ``--set``) decides."""
    (project.path / "train.py").write_text(TRAIN)
    toml = project.path / "orch.toml"
    text = toml.read_text()
    local = f'[targets.local]\nkind = "local"\nroot = "{project.root}"\n'
    toml.write_text(text[:text.index("[targets.local]")] + local)
    yield project
    project.run("stop", "--all")


def _deploy(p, *args: str) -> int:
    res = p.run("deploy", "--json", *args)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["experiment"]["id"]


def _written(folder: Path, exp_id: int) -> None:
    wait_for(lambda: (folder / f"only-exp{exp_id}.bin").exists(), what=f"experiment {exp_id}'s checkpoint")


def _entries(folder: Path) -> dict[str, list[str]]:
    trash = folder.with_name(folder.name + ".trash")
    return {e: sorted(os.listdir(trash / e)) for e in sorted(os.listdir(trash))} if trash.is_dir() else {}


def test_restart_of_a_run_launched_with_another_folder_cleans_and_resumes_from_that_folder(own, tmp_path):
    p = own
    default, other = p.checkpoints, tmp_path / "elsewhere" / "ck"
    assert _deploy(p) == 1
    _written(default, 1)
    assert _deploy(p, "--set", f"paths.checkpoints={other}") == 2
    _written(other, 2)

    res = p.run("restart", "-e", "2", "--clean-checkpoints", "--yes")
    assert res.returncode == 0, res.stderr
    assert f"in {other} " in res.stderr and str(default) not in res.stderr, res.stderr
    # experiment 1's files never moved; experiment 2's went to its own folder's trash
    assert sorted(os.listdir(default)) == ["last.ckpt", "only-exp1.bin"] and _entries(default) == {}
    [(entry, files)] = _entries(other).items()
    assert entry.endswith("-exp2") and files == [".orch-trash.json", "last.ckpt", "only-exp2.bin"]
    assert f"(orch checkpoints restore -e 3 {entry})" in res.stderr, res.stderr  # the folder, whatever orch.toml says
    _written(other, 3)
    with p.registry() as reg:
        three = reg.get(3)
    assert three.checkpoints == str(other) == three.config["paths"]["checkpoints"]
    assert three.checkpoints_entry == str(other.with_name("ck.trash") / entry)

    listed = json.loads(p.run("checkpoints", "list", "-e", "3", "--json").stdout)
    assert (listed["path"], listed["files"]) == (str(other), 2)
    from orchestrator.config import load_settings
    from orchestrator.ui import actions

    answer = actions.checkpoints(load_settings(p.path / "orch.toml"), three)  # the dashboard's checkpoints panel
    assert answer.ok and (answer.data["path"], answer.data["files"]) == (str(other), 2), answer
    # a bare restart relaunches the latest experiment (3) where it ran, too
    res = p.run("restart", "--clean-checkpoints", "--yes", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["experiment"]["checkpoints"] == str(other)
    assert sorted(os.listdir(default)) == ["last.ckpt", "only-exp1.bin"] and len(_entries(other)) == 2


def test_pull_after_a_restart_with_a_clean_brings_the_experiments_own_files_from_its_trash_entry(own, tmp_path):
    p = own
    assert _deploy(p) == 1
    _written(p.checkpoints, 1)
    first = p.run("pull", "-e", "1", "--checkpoints")
    assert first.returncode == 0, first.stderr
    mine = p.path / "orch-pull" / "exp1" / "checkpoints"
    assert (mine / "last.ckpt").read_text() == "weights of experiment 0001"

    res = p.run("restart", "--clean-checkpoints", "--yes")
    assert res.returncode == 0, res.stderr
    _written(p.checkpoints, 2)
    [entry] = _entries(p.checkpoints)

    # the plain pull again: experiment 2's last.ckpt is not experiment 1's, and the local copy stays as it is
    res = p.run("pull", "-e", "1", "--checkpoints")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "--force" not in res.stderr + res.stdout
    assert "skipped checkpoints/last.ckpt: written by experiment 2" in res.stderr, res.stderr
    assert (mine / "last.ckpt").read_text() == "weights of experiment 0001"
    assert f"from trash entry {entry}" in res.stdout + res.stderr, res.stdout + res.stderr

    # into a fresh folder: experiment 1's files, from the trash entry they were moved to
    res = p.run("pull", "-e", "1", "--checkpoints", "--to", str(tmp_path / "one"), "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    got = tmp_path / "one" / "checkpoints"
    assert sorted(os.listdir(got)) == ["last.ckpt", "only-exp1.bin"]
    assert (got / "last.ckpt").read_text() == "weights of experiment 0001"
    assert {s["key"]: s["why"] for s in data["skipped"]} == {
        "checkpoints/last.ckpt": "written by experiment 2", "checkpoints/only-exp2.bin": "written by experiment 2"}
    assert {f["key"]: f.get("entry") for f in data["files"]} == {
        "checkpoints/last.ckpt": entry, "checkpoints/only-exp1.bin": entry}

    res = p.run("pull", "-e", "2", "--checkpoints", "--to", str(tmp_path / "two"))
    assert res.returncode == 0, res.stderr
    assert sorted(os.listdir(tmp_path / "two" / "checkpoints")) == ["last.ckpt", "only-exp2.bin"]
    assert (tmp_path / "two" / "checkpoints" / "last.ckpt").read_text() == "weights of experiment 0002"


def test_a_differing_local_copy_of_the_experiments_own_file_is_refused_without_naming_force_over_a_writer(own):
    """A conflict left is between the run's own file and one here: the hint says whose the target's file is."""
    p = own
    assert _deploy(p) == 1
    _written(p.checkpoints, 1)
    mine = p.path / "orch-pull" / "exp1" / "checkpoints"
    mine.mkdir(parents=True)
    (mine / "last.ckpt").write_text("weights of experiment 9999")  # same size, other bytes
    res = p.run("pull", "-e", "1", "--checkpoints")
    assert res.returncode == 5, res.stdout + res.stderr
    assert "differ from experiment 1's own" in res.stderr, res.stderr
    assert (mine / "last.ckpt").read_text() == "weights of experiment 9999"


def test_no_at_the_restart_prompt_says_what_was_left_and_what_to_type_instead(own):
    import sys

    from tests.conftest import run_on_pty

    p = own
    assert _deploy(p) == 1
    _written(p.checkpoints, 1)
    argv = [sys.executable, "-m", "orchestrator.cli.main", "restart", "--clean-checkpoints"]
    code, screen = run_on_pty(argv, p.path, {"move to the trash": "n"})
    assert code == 2, screen
    assert f"error: cancelled: nothing was changed on local; the 2 checkpoint file(s) in {p.checkpoints} are where " \
           "they were" in screen, screen
    assert "hint: rerun with --yes to move them to the trash without being asked, or without --clean-checkpoints " \
           "to keep them (the new run resumes from them)" in screen, screen
    assert sorted(os.listdir(p.checkpoints)) == ["last.ckpt", "only-exp1.bin"] and _entries(p.checkpoints) == {}
    with p.registry() as reg:
        assert [(e.id, e.status) for e in reg.list()] == [(1, "running")]


def test_pull_of_an_experiment_finds_it_under_the_root_it_ran_with_after_orch_toml_changed(own, tmp_path):
    p = own
    assert _deploy(p) == 1
    _written(p.checkpoints, 1)
    assert p.run("stop").returncode == 0
    toml = p.path / "orch.toml"
    toml.write_text(toml.read_text().replace(f'root = "{p.root}"', f'root = "{tmp_path / "new-root"}"'))
    res = p.run("pull", "-e", "1", "--checkpoints", "--to", str(tmp_path / "one"))
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "one" / "checkpoints" / "last.ckpt").read_text() == "weights of experiment 0001"
    listed = json.loads(p.run("checkpoints", "list", "-e", "1", "--json").stdout)
    assert (listed["path"], listed["files"]) == (str(p.checkpoints), 2)
