"""A 100% full target (a real tmpfs as the local target's root, filled by a filler file while a run runs):
the remedies still work, a deploy fails with one clear line and leaves nothing half-written behind."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import tmux_socket

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")

QUIET = "import time\nprint('step=1 loss=1.0', flush=True)\nwhile True:\n    time.sleep(0.1)\n"
NO_PREFLIGHT = """name: deploy
description: deploy without the free-space preflight, to reach the blob store on a full disk
steps:
  - step: push_revision
  - step: stop_run
  - step: checkpoints
  - step: record
  - step: start_run
  - step: verify_started
"""


@pytest.fixture
def full_root(project):
    """The project's target root on a 80 MB tmpfs of its own; unmounted after the test's runs end."""
    project.root.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=80m,mode=0755", "tmpfs", str(project.root)], check=True)
    yield project.root
    subprocess.run(["tmux", "-L", tmux_socket(str(project.root)), "kill-server"], capture_output=True)
    deadline = time.monotonic() + 5  # the panes' processes (a standby supervisor too) end at the SIGHUP, not at once
    while subprocess.run(["umount", str(project.root)], capture_output=True).returncode != 0 and \
            time.monotonic() < deadline:
        time.sleep(0.1)
    if os.path.ismount(project.root):
        subprocess.run(["umount", "-l", str(project.root)], capture_output=True)
        pytest.fail(f"{project.root} was busy at teardown")


def fill(root: Path) -> Path:
    """Write a filler file until the filesystem says ENOSPC: 100% full."""
    filler = root / "filler"
    with open(filler, "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * (1 << 20))
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        try:
            while True:
                fh.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    assert os.statvfs(root).f_bavail == 0
    return filler


def logged(root: Path, text: str, timeout: float = 30.0) -> None:
    """Wait until a run's log under ``root`` holds ``text``: the command has started and written its line."""
    deadline = time.monotonic() + timeout
    while not any(text in p.read_text(errors="replace") for p in (root / "runs").glob("*/train.log")):
        assert time.monotonic() < deadline, f"no run logged {text!r} within {timeout:g} s"
        time.sleep(0.1)


def leftovers(root: Path) -> list[str]:
    """Partial files of orch's own: temporary files and blob parts."""
    return [str(p) for sub in ("blobs", "revisions", "runs") for p in (root / sub).rglob("*")
            if p.name.startswith((".tmp-", ".part-"))]


def test_stop_list_and_purge_work_on_a_full_target_and_a_deploy_fails_cleanly(project, full_root):
    (project.path / "quiet.py").write_text(QUIET)
    project.configure(extra="")
    quiet = ["--set", "project.sources=['quiet.py', 'train.py']", "--set", "project.command=python3 quiet.py"]
    ck = project.checkpoints
    ck.mkdir()
    (ck / "ckpt-1.npz").write_bytes(os.urandom(4 << 20))
    res = project.cli("checkpoints", "clean", "--yes")
    assert res.exit_code == 0, res.output  # a trash entry to purge later
    for name, size in (("ckpt-2.npz", 1000), ("ckpt-3.npz.tmp", 50), ("ckpt-4.npz.tmp-81", 50), (".lock", 1)):
        (ck / name).write_bytes(b"x" * size)
    assert project.run("deploy", *quiet).returncode == 0
    logged(full_root, "step=1")  # its one line written: from now on it writes nothing, so the full disk is no harm
    fill(full_root)

    listing = project.cli("checkpoints", "list", "--json")
    assert listing.exit_code == 0, listing.output
    inv = json.loads(listing.stdout)
    assert inv["files"] == 1 and inv["bytes"] == 1000 and inv["newest"] == "ckpt-2.npz"  # not the temporary ones
    assert len(inv["entries"]) == 1

    (project.path / "quiet.py").write_text(QUIET + "# changed\n")  # new content: a blob to store
    (project.path / "big.bin").write_bytes(os.urandom(2 << 20))
    big = ["--set", "project.sources=['quiet.py', 'train.py', 'big.bin']", "--set", "project.command=python3 quiet.py"]
    refused = project.run("deploy", *big)  # the built-in preflight: too little free space
    assert refused.returncode != 0 and "MB free under" in refused.stderr and "orch checkpoints purge" in refused.stderr
    (project.path / "playbooks").mkdir()
    (project.path / "playbooks" / "deploy.yaml").write_text(NO_PREFLIGHT)
    failed = project.run("deploy", *big)
    assert failed.returncode != 0
    lines = [ln for ln in failed.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "no space left" in lines[0] and "free" in lines[0], failed.stderr
    assert "OSError" not in failed.stderr and "Traceback" not in failed.stderr
    assert "orch checkpoints purge" in failed.stderr
    assert leftovers(full_root) == []
    assert all(e.status != "launching" for e in project.registry().list())
    assert json.loads(project.run("status", "--json").stdout)["state"] == "running"  # the run was not touched

    stop = project.run("stop")
    assert stop.returncode == 0, stop.stderr
    assert json.loads(project.run("status", "--json").stdout)["state"] == "stopped"

    purge = project.run("checkpoints", "purge", "--all", "--yes")
    assert purge.returncode == 0, purge.stderr
    assert os.statvfs(full_root).f_bavail * os.statvfs(full_root).f_frsize >= 4 << 20
    assert leftovers(full_root) == []


def test_stale_temporary_files_are_cleaned_on_the_next_locked_call(project):
    project.configure()
    for sub in ("blobs", "revisions", "runs/7"):
        (project.root / sub).mkdir(parents=True)
    old, new = project.root / "blobs" / ".tmp-old", project.root / "blobs" / ".tmp-new"
    stale_dir = project.root / "revisions" / ".tmp-abc-123"
    stale_run = project.root / "runs/7" / ".tmp-xyz"  # a run folder from before registry keys
    part = project.root / "blobs" / (".part-" + "a" * 64)  # a cut push's part: kept so the next push resumes
    for p in (old, new, stale_run, part):
        p.write_bytes(b"x")
    stale_dir.mkdir()
    (stale_dir / "f").write_bytes(b"x")
    hour_ago = time.time() - 3700
    for p in (old, stale_dir, stale_run, part):
        os.utime(p, (hour_ago, hour_ago))
    assert project.cli("stop").exit_code == 0  # a locked call
    assert not old.exists() and not stale_dir.exists() and not stale_run.exists()
    assert new.exists() and part.exists()


ENDS = "import time\nprint('step=1 loss=1.0', flush=True)\ntime.sleep(2)\nraise SystemExit(3)\n"


def test_a_command_that_ends_on_a_full_disk_reads_as_crashed_with_its_code(project, full_root):
    (project.path / "ends.py").write_text(ENDS)
    project.configure(extra="")
    res = project.run("deploy", "--set", "project.sources=['ends.py', 'train.py']", "--set",
                      "project.command=python3 ends.py")
    assert res.returncode == 0, res.stderr
    logged(full_root, "step=1")
    filler = fill(full_root)
    deadline = time.monotonic() + 30
    while (state := json.loads(project.run("status", "--json").stdout))["state"] == "running":
        assert time.monotonic() < deadline, state
        time.sleep(0.3)
    assert state["state"] == "crashed" and state["exit_code"] == 3, state  # not "lost": its exit was recorded
    assert os.statvfs(full_root).f_bavail == 0  # it was recorded on a disk still full
    filler.unlink()
