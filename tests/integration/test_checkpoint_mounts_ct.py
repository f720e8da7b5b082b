"""Checkpoints on a Proxmox mount point, in a real container: ``mp0: ...,mp=/workspace/checkpoints``.

Proxmox makes an ``mpN`` volume a filesystem of its own mounted into the CT at ``mp=``; for a
directory or LVM storage that is an ext4 image with its ``lost+found``. Here each test gets a fresh
CT 202 whose LXC config carries an ``lxc.mount.entry`` bind mount of a loop-mounted 64 MB ext4 image
from the host, at the checkpoint folder (``ro`` as ``ro=1`` would make it). A dedicated CT with the
entry in its config, rather than a mount injected into a running one, is what a CT with ``mp0`` is, and
costs well under a second. The volume is read on the host side to compare bytes.

A clean must stay on that filesystem (a rename into the hidden ``.orch-trash/`` inside it), keep
every checkpoint byte for byte, start the new run, and ``checkpoints restore`` must bring them back;
a clean that cannot work (a read-only volume) is refused before the old run is stopped.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import EXAMPLE, tmux_socket
from tests.integration.test_remote import ROOT, SMALL_BATCHES, RemoteProject
from tests.testbed.lxc import Container, sh
from tests import waits

pytestmark = pytest.mark.testbed

VMID = 202
CKPT = "/workspace/checkpoints"


@dataclass
class MountedContainer(Container):
    """A testbed CT with extra ``lxc.mount.entry`` lines in its config, as pct writes them for ``mpN``."""

    mount_entries: tuple[str, ...] = ()

    def _config(self) -> str:
        return super()._config() + "".join(f"lxc.mount.entry = {entry}\n" for entry in self.mount_entries)


@pytest.fixture
def mp_ct(testbed, tmp_path, monkeypatch):
    """mp_ct(read_only=False, files={}) -> (project, volume): CT 202 with an ext4 volume at the
    checkpoint folder (``files`` written to it first), and a project whose bare commands reach it.
    Teardown destroys the CT, then unmounts the volume, even when the test failed."""
    monkeypatch.setenv("ORCH_PROXMOX_TOKEN", testbed.api.token_secret)
    made: list[tuple[Container | None, Path]] = []

    def make(read_only: bool = False, files: dict[str, bytes] | None = None) -> tuple[RemoteProject, Path]:
        image, volume = tmp_path / "mp0.raw", tmp_path / "mp0"
        volume.mkdir()
        sh("truncate", "-s", "64M", str(image))
        sh("mkfs.ext4", "-q", "-F", str(image))
        sh("mount", "-o", "loop", str(image), str(volume))
        made.append((None, volume))
        for name, data in (files or {}).items():
            (volume / name).write_bytes(data)
        options = "bind,create=dir" + (",ro" if read_only else "")
        ct = MountedContainer(VMID, testbed.base, testbed.public_key,
                              mount_entries=(f"{volume} {CKPT.lstrip('/')} none {options} 0 0",))
        made[-1] = (ct, volume)
        ct.create()
        ct.start()
        path = tmp_path / "proj"
        path.mkdir()
        (path / "train.py").write_bytes((EXAMPLE / "train.py").read_bytes())
        project = RemoteProject(path, testbed)
        with project.known_hosts.open("a") as fh:
            fh.write(ct.host_key_line + "\n")
        project.write(entries=False, checkpoints=CKPT, extra=SMALL_BATCHES)  # steps of milliseconds
        return project, volume

    yield make
    failed = []
    for ct, volume in reversed(made):
        if ct is not None:
            ct.destroy()  # its processes die with it, so nothing holds the volume any more
        if subprocess.run(["umount", str(volume)], capture_output=True).returncode != 0:
            failed.append(volume)
            subprocess.run(["umount", "-l", str(volume)], capture_output=True)
    assert not failed, f"{failed} were busy at teardown"


def on_ct(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return sh("lxc-attach", "-n", str(VMID), "--", *argv, check=check)


def digests(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` (relative paths), read on the host side of the volume."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def checkpoints_in(volume: Path) -> dict[str, str]:
    """The complete checkpoints at the top of the volume (train.py writes them by rename)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(volume.glob("ckpt-*.npz"))}


def wait_for(what: str, check, timeout: float = 30) -> None:
    """Poll ``check``; on timeout, say what the CT shows (the runs' logs, the folder and its mount)."""
    def shown() -> str:
        seen = on_ct("sh", "-c", 'tail -n 5 "$0"/runs/*/train.log; ls -la "$1"; findmnt "$1"', ROOT, CKPT, check=False)
        return f"the CT shows:\n{seen.stdout.decode()}"

    waits.wait_for(check, timeout=timeout, what=what, every=0.2, describe=shown)


def status(project: RemoteProject) -> dict:
    res = project.cli("status", "--json", "--no-metrics")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_restart_clean_on_a_mount_point_keeps_every_checkpoint_and_restore_brings_them_back(mp_ct):
    project, volume = mp_ct()
    res = project.cli("deploy", "--ct", str(VMID), "-m", "first", "--json")
    assert res.exit_code == 0, res.output
    assert on_ct("findmnt", "-n", "-o", "FSTYPE", CKPT).stdout.decode().strip() == "ext4"
    wait_for("two checkpoints", lambda: len(checkpoints_in(volume)) >= 2)
    before = checkpoints_in(volume)

    res = project.cli("restart", "--clean-checkpoints", "--yes", "--json")  # bare: CT 202 is the current target
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["stopped"][0]["id"] == 1 and out["experiment"]["status"] == "running"
    entry = out["experiment"]["checkpoints_entry"]
    assert entry.startswith(f"{CKPT}/.orch-trash/") and entry.endswith("-exp1")  # on the volume, by rename
    assert on_ct("test", "-e", f"{CKPT}.trash", check=False).returncode != 0
    moved = digests(volume / ".orch-trash" / Path(entry).name)
    meta = json.loads((volume / ".orch-trash" / Path(entry).name / ".orch-trash.json").read_text())
    assert meta["experiment"] == "exp1" and meta["moved_by"] == 2
    for name, digest in before.items():  # every checkpoint, byte for byte (plus a final one written on SIGINT)
        assert moved[name] == digest
    assert (volume / "lost+found").is_dir()  # the volume's own folder is not a checkpoint: it stays

    exp2 = project.registry().get(2)
    assert exp2.status == "running" and exp2.checkpoints_action == "moved"
    assert status(project)["experiment"] == 2
    wait_for("a checkpoint of the new run", lambda: checkpoints_in(volume))
    log = on_ct("cat", f"{ROOT}/runs/{project.run_key(2)}/train.log").stdout.decode()
    assert "resumed from" not in log  # it started fresh: the trash inside the folder is not its to read
    assert project.cli("stop").exit_code == 0

    listing = json.loads(project.cli("checkpoints", "list", "--json").stdout)
    assert all(not f["path"].startswith((".orch-trash", "lost+found")) for f in listing["listing"])
    assert [(e["name"], e["trash"]) for e in listing["entries"]] == [(Path(entry).name, f"{CKPT}/.orch-trash")]
    assert project.cli("checkpoints", "clean", "--yes").exit_code == 0  # the new run's checkpoints, out of the way
    assert checkpoints_in(volume) == {}
    res = project.cli("checkpoints", "restore", Path(entry).name)
    assert res.exit_code == 0, res.output
    restored = {name: digest for name, digest in digests(volume).items() if "/" not in name}
    assert restored == {name: d for name, d in moved.items() if name != ".orch-trash.json"}
    assert {name: restored[name] for name in before} == before
    assert (volume / "lost+found").is_dir()


def test_a_clean_that_cannot_move_on_a_read_only_mount_point_is_refused_before_the_run_stops(mp_ct):
    weights = {"pretrained.pt": b"weights" * 1000, "tokenizer.json": b'{"vocab": 1}'}
    project, volume = mp_ct(read_only=True, files=weights)
    toml = project.path / "orch.toml"  # the run only reads the folder: it writes no checkpoint into it
    toml.write_text(toml.read_text().replace('TINYLM_CKPT_EVERY = "10"', 'TINYLM_CKPT_EVERY = "1000000"'))
    assert on_ct("touch", f"{CKPT}/probe", check=False).returncode != 0  # really read-only inside the CT
    res = project.cli("deploy", "--ct", str(VMID))
    assert res.exit_code == 0, res.output
    log = f"{ROOT}/runs/{project.run_key(1)}/train.log"
    wait_for("the run's first steps", lambda: " loss=" in on_ct("cat", log).stdout.decode())
    before = digests(volume)

    res = project.run("restart", "--clean-checkpoints", "--yes")  # as a subprocess: the exit code a shell sees
    assert res.returncode == 6, res.stderr
    assert f"error: {CKPT} is not writable" in res.stderr and "read-only" in res.stderr and "hint:" in res.stderr
    assert "stopped" not in res.stdout + res.stderr
    assert status(project)["state"] == "running"
    assert [(e.id, e.status) for e in project.registry().list()] == [(1, "running")]  # refused in the probe
    assert on_ct("tmux", "-L", tmux_socket(ROOT), "has-session", "-t", "orch-tinylm", check=False).returncode == 0
    assert digests(volume) == before and not (volume / ".orch-trash").exists()
