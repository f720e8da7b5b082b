"""Checkpoints on a filesystem of their own (a Proxmox ``mpN`` mount point), with real tmpfs mounts.

A rename cannot cross filesystems, so the trash must live on the checkpoint folder's own filesystem,
and a clean that could not work is refused before the running experiment is stopped.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import tmux_socket

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


@pytest.fixture
def mount(project):
    """mount(path, ro=False): a fresh 64 MB tmpfs at path, unmounted after the test (after its runs end)."""
    mounted: list[Path] = []

    def do(path: Path, ro: bool = False) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        opts = "size=64m" + (",ro" if ro else "")
        subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], check=True)
        mounted.append(path)
        return path

    yield do
    subprocess.run(["tmux", "-L", tmux_socket(str(project.root)), "kill-server"], capture_output=True)
    failed = []
    for path in reversed(mounted):
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            failed.append(path)
            subprocess.run(["umount", "-l", str(path)], capture_output=True)
    assert not failed, f"{failed} were busy at teardown"


def files_under(folder: Path, skip: str | None = None) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not (skip and p.relative_to(folder).parts[0] == skip)}


def wait_for_checkpoints(project, n: int) -> None:
    deadline = time.monotonic() + 30
    while len(list(project.checkpoints.glob("ckpt-*.npz"))) < n:
        assert time.monotonic() < deadline, "the run wrote no checkpoints"
        time.sleep(0.1)


def status(project) -> dict:
    res = project.cli("status", "--json", "--no-metrics")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_clean_checkpoints_on_a_mount_point_keeps_them_on_its_filesystem(project, mount):
    mount(project.checkpoints)
    project.configure(steps=100000, ckpt_every=5, sleep=0.01)
    assert project.cli("deploy", "-m", "first").exit_code == 0
    wait_for_checkpoints(project, 2)
    before = {p.name: p.read_bytes() for p in project.checkpoints.glob("ckpt-*.npz")}  # complete ones only

    res = project.cli("restart", "--clean-checkpoints", "--yes", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["stopped"][0]["id"] == 1 and out["experiment"]["status"] == "running"
    entry = Path(out["experiment"]["checkpoints_entry"])
    assert entry.parent == project.checkpoints / ".orch-trash"
    assert not project.checkpoints.with_name("checkpoints.trash").exists()
    moved = files_under(entry)
    meta = json.loads(moved.pop(".orch-trash.json"))
    assert meta["experiment"] == "exp1" and meta["moved_by"] == 2 and out["checkpoints"]["moved"] == len(moved)
    for name, data in before.items():  # every checkpoint, byte for byte (plus any the old run wrote on SIGINT)
        assert moved[name] == data

    wait_for_checkpoints(project, 1)  # the new run writes beside the trash, which is not part of the folder
    assert project.cli("stop").exit_code == 0
    listing = json.loads(project.cli("checkpoints", "list", "--json").stdout)
    assert all(not f["path"].startswith(".orch-trash") for f in listing["listing"])
    assert listing["files"] == len(files_under(project.checkpoints, skip=".orch-trash")) > 0
    assert [(e["name"], e["trash"]) for e in listing["entries"]] == [(entry.name, str(entry.parent))]

    assert project.cli("checkpoints", "clean", "--yes").exit_code == 0
    assert files_under(project.checkpoints, skip=".orch-trash") == {}
    res = project.cli("checkpoints", "restore", entry.name)
    assert res.exit_code == 0, res.output
    assert files_under(project.checkpoints, skip=".orch-trash") == moved


def test_entries_of_the_older_layout_beside_a_mount_point_are_listed_restored_and_purged(project, mount):
    mount(project.checkpoints)
    old = project.root / "checkpoints.trash"  # made before the folder became a mount point: another filesystem
    for name, data in (("20200101T000000Z-exp1", b"one"), ("20200102T000000Z-exp2", b"two")):
        (old / name).mkdir(parents=True)
        (old / name / "model.pt").write_bytes(data)
        (old / name / ".orch-trash.json").write_text(json.dumps({"experiment": name[-4:], "created": 1.0}))
    (project.checkpoints / "new.pt").write_bytes(b"new")
    assert project.cli("checkpoints", "clean", "--yes").exit_code == 0
    listing = json.loads(project.cli("checkpoints", "list", "--json").stdout)
    names = [e["name"] for e in listing["entries"]]
    assert names[:2] == ["20200101T000000Z-exp1", "20200102T000000Z-exp2"] and len(names) == 3
    assert listing["trash_dirs"] == [str(project.checkpoints / ".orch-trash"), str(old)]
    text = project.cli("checkpoints", "list").stdout
    assert "20200101T000000Z-exp1" in text and "20200102T000000Z-exp2" in text

    res = project.cli("checkpoints", "restore", "20200101T000000Z-exp1")  # across filesystems: copied back
    assert res.exit_code == 0, res.output
    assert (project.checkpoints / "model.pt").read_bytes() == b"one" and not (old / "20200101T000000Z-exp1").exists()
    assert project.cli("checkpoints", "purge", "20200102T000000Z-exp2", "--yes").exit_code == 0
    assert not (old / "20200102T000000Z-exp2").exists()
    left = json.loads(project.cli("checkpoints", "list", "--json").stdout)["entries"]
    assert [e["name"] for e in left] == [names[2]]


def test_a_clean_that_cannot_rename_is_refused_before_the_run_is_stopped(project, mount):
    mount(project.root / "checkpoints.trash")  # the trash given a volume of its own, beside a plain folder
    project.configure(steps=100000, ckpt_every=5, sleep=0.01)
    assert project.cli("deploy").exit_code == 0
    wait_for_checkpoints(project, 1)

    res = project.cli("restart", "--clean-checkpoints", "--yes")
    assert res.exit_code == 6, res.output
    assert "another filesystem" in res.output and "hint:" in res.output
    assert [e.id for e in project.registry().list()] == [1]  # refused in the probe: nothing recorded
    assert status(project)["state"] == "running"
    assert project.registry().get(1).status == "running"
    assert list(project.checkpoints.glob("ckpt-*.npz")) and not any((project.root / "checkpoints.trash").iterdir())

    assert project.cli("stop").exit_code == 0
    before = files_under(project.checkpoints)
    res = project.cli("checkpoints", "clean", "--yes")
    assert res.exit_code == 6 and "another filesystem" in res.output
    assert files_under(project.checkpoints) == before


def test_a_read_only_checkpoint_mount_is_refused_before_the_run_is_stopped(project, mount):
    mount(project.checkpoints, ro=True)
    project.configure(steps=100000, ckpt_every=100000, sleep=0.01)
    assert project.cli("deploy").exit_code == 0
    subprocess.run(["mount", "-o", "remount,rw", str(project.checkpoints)], check=True)
    (project.checkpoints / "pretrained.pt").write_bytes(b"weights")
    subprocess.run(["mount", "-o", "remount,ro", str(project.checkpoints)], check=True)

    res = project.cli("restart", "--clean-checkpoints", "--yes")
    assert res.exit_code == 6, res.output
    assert "not writable" in res.output and "hint:" in res.output
    assert status(project)["state"] == "running" and [e.id for e in project.registry().list()] == [1]
    assert (project.checkpoints / "pretrained.pt").read_bytes() == b"weights"


def test_a_volumes_lost_and_found_is_not_a_checkpoint(project, mount):
    mount(project.checkpoints)  # as an ext4 mpN volume is: lost+found at its root, fsck's folder
    (project.checkpoints / "lost+found").mkdir()
    (project.checkpoints / "lost+found" / "#12").write_bytes(b"fsck")
    (project.checkpoints / "ckpt-000010.npz").write_bytes(b"ten")
    listing = json.loads(project.cli("checkpoints", "list", "--json").stdout)
    assert [f["path"] for f in listing["listing"]] == ["ckpt-000010.npz"] and listing["files"] == 1

    assert project.cli("checkpoints", "clean", "--yes").exit_code == 0
    assert files_under(project.checkpoints, skip=".orch-trash") == {"lost+found/#12": b"fsck"}
    entry = json.loads(project.cli("checkpoints", "list", "--json").stdout)["entries"][0]["name"]
    assert project.cli("checkpoints", "restore", entry).exit_code == 0  # no clash with the one left in place
    assert files_under(project.checkpoints, skip=".orch-trash") == {"lost+found/#12": b"fsck",
                                                                    "ckpt-000010.npz": b"ten"}
    assert project.cli("checkpoints", "clean", "--yes").exit_code == 0
    assert project.cli("checkpoints", "clean", "--yes").exit_code == 0  # only lost+found left: no new entry
    assert len(json.loads(project.cli("checkpoints", "list", "--json").stdout)["entries"]) == 1


def test_a_run_beside_others_on_a_mount_point_keeps_its_own_folder_on_that_filesystem(project, mount):
    from tests.cli.test_beside import TRAIN

    mount(project.checkpoints)  # beside it would be another filesystem: the run's own folder is inside, hidden
    (project.path / "train.py").write_text(TRAIN)
    project.configure(extra="gpus = 2\n")
    assert project.cli("deploy", "--gpus", "1").exit_code == 0
    res = project.cli("deploy", "--gpus", "1", "--beside")
    assert res.exit_code == 0, res.output
    own = project.checkpoints / ".orch-exp" / "exp2"
    assert project.registry().get(2).checkpoints == str(own)
    deadline = time.monotonic() + 30
    while not ((own / "ckpt-exp2.pt").exists() and (project.checkpoints / "ckpt-exp1.pt").exists()):
        assert time.monotonic() < deadline, "the runs wrote no checkpoints"
        time.sleep(0.1)
    assert os.stat(own).st_dev == os.stat(project.checkpoints).st_dev
    listing = json.loads(project.cli("checkpoints", "list", "--json").stdout)
    assert [f["path"] for f in listing["listing"]] == ["ckpt-exp1.pt"]
    assert [(v["exp"], v["path"], v["files"]) for v in listing["variants"]] == [(2, str(own), 1)]

    assert project.cli("stop", "-e", "2").exit_code == 0 and project.cli("stop", "-e", "1").exit_code == 0
    assert project.cli("checkpoints", "clean", "--yes").exit_code == 0  # the lineage's files only
    assert files_under(project.checkpoints, skip=".orch-trash") == {".orch-exp/exp2/ckpt-exp2.pt": b"weights"}
