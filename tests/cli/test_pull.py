"""orch pull on the local target (real CLI, tmux, SQLite, the agent as a subprocess): a run's checkpoints, outputs
and log come home byte for byte, a second pull sends nothing, a cut pull resumes, a differing local file is
refused without --force, and a symlink in the run's folders never sends what it points at."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.cli.test_lifecycle import wait_status

TRAIN = """\
import os, pathlib
ck = pathlib.Path(os.environ["ORCH_CHECKPOINT_DIR"])
ck.mkdir(parents=True, exist_ok=True)
(ck / "ckpt-000010.pt").write_bytes(os.urandom(3 << 20))
(ck / "sub").mkdir(exist_ok=True)
(ck / "sub" / "opt.bin").write_bytes(b"optimizer state\\n" * 1000)
(ck / ".half.tmp").write_bytes(b"half")
out = pathlib.Path("out")
out.mkdir(exist_ok=True)
(out / "samples.txt").write_text("a sample\\n")
(out / "eval.json").write_text('{"loss": 1.5}')
os.symlink("/etc", "out/etc")
os.symlink("/etc/hostname", "out/host")
print("step=1 loss=1.0", flush=True)
"""


def _deploy(project) -> int:
    (project.path / "train.py").write_text(TRAIN)
    res = project.cli("deploy", "--json")
    assert res.exit_code == 0, res.output
    exp_id = json.loads(res.stdout)["experiment"]["id"]
    wait_status(project, exp_id, ("finished",))
    return exp_id


def _tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.name.startswith(".")}


def _pull(project, *args: str):
    return project.run("pull", *args)


def test_pull_brings_everything_byte_identical_and_a_second_pull_sends_nothing(project):
    exp_id = _deploy(project)
    res = _pull(project, "-e", str(exp_id), "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    dest = project.path / "orch-pull" / f"exp{exp_id}"
    assert Path(data["dest"]) == Path("orch-pull") / f"exp{exp_id}"
    run_dir = project.run_dir(exp_id)
    want = {**{f"checkpoints/{k}": v for k, v in _tree(project.checkpoints).items()},
            **{f"outputs/{k}": v for k, v in _tree(run_dir / "work" / "out").items() if k not in ("etc", "host")},
            "train.log": hashlib.sha256((run_dir / "train.log").read_bytes()).hexdigest()}
    want = {k.replace("outputs/", "outputs/out/", 1) if k.startswith("outputs/") else k: v for k, v in want.items()}
    assert _tree(dest) == want
    assert "outputs/train.py" not in _tree(dest)  # the revision's own files are not outputs
    assert data["sent_bytes"] == sum((dest / k).stat().st_size for k in want)
    skipped = {s["key"]: s["why"] for s in data["skipped"]}
    assert skipped == {"outputs/out/etc": "a symlink to a folder", "outputs/out/host": "a symlink"}
    assert not (dest / "outputs" / "out" / "etc").exists() and not (dest / "outputs" / "out" / "host").exists()

    again = _pull(project, "-e", str(exp_id), "--json")
    assert again.returncode == 0, again.stderr
    second = json.loads(again.stdout)
    assert second["sent_bytes"] == 0
    assert second["summary"]["same"] == len(want)
    assert _tree(dest) == want


def test_a_differing_local_file_is_refused_without_force_and_nothing_is_written(project):
    exp_id = _deploy(project)
    assert _pull(project, "-e", str(exp_id), "--outputs").returncode == 0
    dest = project.path / "orch-pull" / f"exp{exp_id}"
    (dest / "outputs" / "out" / "eval.json").write_text('{"loss": 9.9}')  # same size, other bytes
    (dest / "outputs" / "out" / "samples.txt").unlink()
    before = {p: p.read_bytes() for p in dest.rglob("*") if p.is_file()}
    res = _pull(project, "-e", str(exp_id))
    assert res.returncode == 5, res.stdout + res.stderr
    assert "error: 1 file(s) in orch-pull" in res.stderr and "outputs/out/eval.json" in res.stderr
    assert f"hint: the target's are the ones experiment {exp_id} wrote last: orch pull --force" in res.stderr
    assert {p: p.read_bytes() for p in dest.rglob("*") if p.is_file()} == before  # not even the missing ones

    dry = _pull(project, "-e", str(exp_id), "--dry-run", "--force")
    assert dry.returncode == 0, dry.stderr
    assert "replace" in dry.stdout and "dry run: nothing written" in dry.stdout
    assert {p: p.read_bytes() for p in dest.rglob("*") if p.is_file()} == before

    forced = _pull(project, "-e", str(exp_id), "--force")
    assert forced.returncode == 0, forced.stderr
    assert (dest / "outputs" / "out" / "eval.json").read_text() == '{"loss": 1.5}'
    assert (dest / "outputs" / "out" / "samples.txt").read_text() == "a sample\n"


def test_a_cut_pull_resumes_from_its_part_file(project):
    exp_id = _deploy(project)
    ckpt = project.checkpoints / "ckpt-000010.pt"
    dest = project.path / "orch-pull" / f"exp{exp_id}"
    part = dest / "checkpoints" / ".ckpt-000010.pt.part"
    part.parent.mkdir(parents=True)
    half = ckpt.read_bytes()[: 1 << 20]
    part.write_bytes(half)  # what a pull cut after its first MiB leaves
    res = _pull(project, "-e", str(exp_id), "--checkpoints", "*.pt", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert [(f["key"], f["action"], f["offset"]) for f in data["files"]] == \
        [("checkpoints/ckpt-000010.pt", "resume", 1 << 20)]
    assert data["sent_bytes"] == ckpt.stat().st_size - (1 << 20)
    assert (dest / "checkpoints" / "ckpt-000010.pt").read_bytes() == ckpt.read_bytes()
    assert not part.exists()


def test_a_stale_part_file_is_caught_by_the_hash_and_pulled_again(project):
    exp_id = _deploy(project)
    dest = project.path / "orch-pull" / f"exp{exp_id}"
    part = dest / "checkpoints" / ".ckpt-000010.pt.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(b"x" * 1000)  # a part of another version of the file
    res = _pull(project, "-e", str(exp_id), "--checkpoints", "ckpt-*")
    assert res.returncode == 2, res.stdout + res.stderr
    assert "changed on the target while they were pulled" in res.stderr
    assert not part.exists() and not (dest / "checkpoints" / "ckpt-000010.pt").exists()
    again = _pull(project, "-e", str(exp_id), "--checkpoints", "ckpt-*")
    assert again.returncode == 0, again.stderr
    assert (dest / "checkpoints" / "ckpt-000010.pt").read_bytes() == \
        (project.checkpoints / "ckpt-000010.pt").read_bytes()


def test_a_symlinked_outputs_folder_is_refused(project):
    exp_id = _deploy(project)
    work = project.run_dir(exp_id) / "work"
    os.rename(work, work.with_name("work-real"))
    os.symlink("/etc", work)
    res = _pull(project, "-e", str(exp_id), "--outputs")
    assert res.returncode == 6, res.stdout + res.stderr
    assert "resolves through a symlink" in res.stderr
    assert not (project.path / "orch-pull").exists()


def test_a_trash_entry_is_pulled_and_bad_paths_are_refused(project):
    exp_id = _deploy(project)
    clean = project.cli("checkpoints", "clean", "--yes")
    assert clean.exit_code == 0, clean.output
    entry = json.loads(project.cli("checkpoints", "list", "--json").stdout)["entries"][0]["name"]
    res = _pull(project, "-e", str(exp_id), "--checkpoints", entry, "--to", "back")
    assert res.returncode == 0, res.stderr
    got = _tree(project.path / "back" / "checkpoints")
    assert set(got) == {"ckpt-000010.pt", "sub/opt.bin"}  # the entry's own record and hidden files stay

    for bad, said in ((["../x"], "GLOB '../x'"), (["/etc/*"], "GLOB '/etc/*'")):
        res = _pull(project, "-e", str(exp_id), *bad)
        assert res.returncode == 2 and f"error: {said}" in res.stderr and "hint:" in res.stderr, res.stderr
    res = _pull(project, "-e", str(exp_id), "--checkpoints", "20990101T000000Z-nope")
    assert res.returncode == 7 and "no trash entry" in res.stderr, res.stderr
    res = _pull(project, "-e", str(exp_id), "--node", "1")
    assert res.returncode == 2 and "--node names a node of a job" in res.stderr, res.stderr
    assert not (project.path / "orch-pull").exists()


@pytest.fixture
def small_disk(tmp_path):
    """A real tmpfs of its own, mounted for the test: ``mount(options)`` returns its folder."""
    folder = tmp_path / "disk"
    folder.mkdir()

    def mount(options: str) -> Path:
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], check=True)
        return folder

    yield mount
    subprocess.run(["umount", str(folder)], capture_output=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_pull_onto_a_full_disk_says_what_it_needs_and_what_is_free(project, small_disk):
    import shutil

    from orchestrator.watch.metrics import format_size

    exp_id = _deploy(project)
    dry = json.loads(_pull(project, "-e", str(exp_id), "--checkpoints", "--dry-run", "--json").stdout)
    need = dry["summary"]["bytes"]
    dest = small_disk("size=2m")  # the 3 MB checkpoint cannot fit: refused before a byte comes
    free = shutil.disk_usage(dest).free
    res = _pull(project, "-e", str(exp_id), "--checkpoints", "--to", str(dest / "exp"))
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"error: {dest / 'exp'} has {format_size(free)} free and this pull needs {format_size(need)} " \
           "(2 file(s)); nothing was pulled" in res.stderr, res.stderr
    assert f"hint: free {format_size(need - free)} there" in res.stderr
    assert [p for p in (dest / "exp").rglob("*") if p.is_file()] == []

    subprocess.run(["umount", str(dest)], check=True)
    dest = small_disk("size=64m,nr_inodes=3")  # room for the bytes, not for the files: ENOSPC as they come
    free = shutil.disk_usage(dest).free
    res = _pull(project, "-e", str(exp_id), "--checkpoints", "--to", str(dest / "exp"))
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"No space left on device; this pull needs {format_size(need)}, {format_size(free)} was free when it " \
           "began" in res.stderr, res.stderr


def test_a_pull_of_a_queued_experiment_says_it_has_not_started(project):
    """The latest experiment is often one waiting in the queue: no run folder yet, and the message says why."""
    project.configure(steps=100000, sleep=0.05)
    assert project.run("deploy").returncode == 0
    queued = project.run("deploy", "--queue", "--json")
    assert queued.returncode == 0, queued.stderr
    exp_id = json.loads(queued.stdout)["experiment"]["id"]
    try:
        res = _pull(project, "-e", str(exp_id), "--checkpoints")
        assert res.returncode == 7, res.stderr
        assert f"error: experiment {exp_id} is queued on local and has not started" in res.stderr
        assert "hint: orch queue says why it waits" in res.stderr
        assert not (project.path / "orch-pull").exists()
    finally:
        assert project.run("stop", "--all").returncode == 0
