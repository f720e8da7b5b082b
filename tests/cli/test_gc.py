"""`orch gc` on the local target through the real CLI: it frees what it listed, and nothing a run needs."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from tests.cli.test_lifecycle import wait_status
from tests.conftest import snapshot

LIVE = ("import time\n"
        "for step in range(1, 100000):\n"
        "    print(f'step={step} loss=1.0', flush=True)\n"
        "    time.sleep(0.2)\n")


def _age(*folders: Path, seconds: float = 7200) -> None:
    """Make everything in the folders look old enough for gc's grace period."""
    old = time.time() - seconds
    for folder in folders:
        for p in [folder, *folder.rglob("*")]:
            os.utime(p, (old, old), follow_symlinks=False)


def _disk(root: Path, skip: Path) -> int:
    """Bytes under root's orch folders, each inode once, leaving out the live run's growing folder."""
    seen, total = set(), 0
    for sub in ("blobs", "revisions", "runs"):
        for p in (root / sub).rglob("*"):
            st = p.lstat()
            if p.is_dir() or skip in p.parents or (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            total += st.st_size
    return total


def _deploy(project, *args: str) -> int:
    res = project.cli("deploy", "--json", *args)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)["experiment"]["id"]


def test_gc_frees_what_it_listed_and_keeps_the_live_run_and_checkpoints(project):
    project.configure(steps=20, ckpt_every=5)
    train = project.path / "train.py"
    original = train.read_text()
    revisions = []
    for i in range(3):
        train.write_text(original + f"\n# variant {i}\n")
        exp = _deploy(project, *(["--clean-checkpoints", "--yes"] if i == 2 else []))
        wait_status(project, exp, ("finished",))
        revisions.append(project.registry().get(exp).revision)
    train.write_text(LIVE)
    live = _deploy(project)
    wait_status(project, live, ("running",))
    live_rev = project.registry().get(live).revision
    root = project.root
    _age(root / "blobs", root / "revisions")
    (root / "blobs" / (".part-" + "a" * 64)).write_bytes(b"x" * 1000)
    _age(root / "blobs" / (".part-" + "a" * 64))
    (root / "blobs" / (".part-" + "b" * 64)).write_bytes(b"y" * 10)  # a push in progress: kept
    ckpt = snapshot(project.checkpoints, root / "checkpoints.trash")
    assert any("checkpoints.trash" in p for p in ckpt) and any("/checkpoints/" in p for p in ckpt)

    res = project.cli("gc", "--keep", "1", "--dry-run", "--json")
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    listed = {(i["kind"], i["name"]) for i in plan["items"]}
    assert {("run", "1"), ("run", "2"), ("run", "3")} <= listed
    assert {("revision", r) for r in revisions} <= listed and ("revision", live_rev) not in listed
    assert ("stale", "blobs/.part-" + "a" * 64) in listed and ("stale", "blobs/.part-" + "b" * 64) not in listed
    assert any(kind == "blob" for kind, _ in listed) and plan["freed"] > 0
    assert project.run_dir(1).exists()  # a dry run changes nothing

    human = project.cli("gc", "--keep", "1", "--dry-run")
    assert human.exit_code == 0 and "would free" in human.stdout and "revision" in human.stdout
    refused = project.cli("gc", "--keep", "1")  # not a terminal, no --yes
    assert refused.exit_code == 2 and "error: refusing without confirmation" in refused.output
    assert "hint: rerun with --yes" in refused.output and project.run_dir(1).exists()

    before = _disk(root, project.run_dir(live))
    res = project.cli("gc", "--keep", "1", "--yes", "--json")
    assert res.exit_code == 0, res.output
    done = json.loads(res.stdout)
    assert {(i["kind"], i["name"]) for i in done["items"]} == listed and done["freed"] == plan["freed"]
    assert before - _disk(root, project.run_dir(live)) == done["freed"]
    assert not project.run_dir(1).exists() and (project.run_dir(live)).exists()
    assert not any((root / "revisions" / r).exists() for r in revisions)
    assert (root / "revisions" / live_rev / "train.py").read_text() == LIVE
    assert snapshot(project.checkpoints, root / "checkpoints.trash") == ckpt
    assert wait_status(project, live, ("running",))

    again = project.cli("gc", "--keep", "1", "--yes", "--json")
    assert again.exit_code == 0 and json.loads(again.stdout)["items"] == []
    res = project.cli("restart", "--json")
    assert res.exit_code == 0, res.output
    new = json.loads(res.stdout)["experiment"]["id"]
    assert wait_status(project, new, ("running",))["experiment"] == new
    assert project.cli("stop").exit_code == 0
