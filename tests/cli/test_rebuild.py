"""`orch experiments rebuild` on the local target: two experiments deployed, the registry corrupted, rebuilt from
the run folders, and `experiments list` shows them again with their states; the corrupt file is kept aside."""

from __future__ import annotations

import json
import os

QUIET = "import time\nprint('step=1 loss=1.0', flush=True)\nwhile True:\n    time.sleep(0.1)\n"
QUIET_FLAGS = ["--set", "project.sources=['quiet.py', 'train.py']", "--set", "project.command=python3 quiet.py"]


def test_rebuild_recreates_a_corrupt_registry_from_the_run_folders(project):
    (project.path / "quiet.py").write_text(QUIET)
    assert project.run("deploy", "-m", "first", *QUIET_FLAGS).returncode == 0
    assert project.run("deploy", "-m", "second", *QUIET_FLAGS).returncode == 0  # stops the first
    with project.registry() as reg:
        before = {e.id: e for e in reg.list()}
        registry_id = reg.registry_id
    assert {i: e.status for i, e in before.items()} == {1: "stopped", 2: "running"}

    db = project.path / ".orch" / "experiments.db"
    garbage = os.urandom(16384)
    db.write_bytes(garbage)
    assert project.run("experiments", "list").returncode == 1  # corrupt: said, not rebuilt by itself

    res = project.run("experiments", "rebuild")
    assert res.returncode == 0, res.stderr
    assert "experiments 1, 2" in res.stdout and "kept as" in res.stdout
    aside = [p for p in db.parent.iterdir() if p.name.startswith("experiments.db.corrupt-")]
    assert len(aside) == 1 and aside[0].read_bytes() == garbage  # kept aside, untouched

    listing = project.run("experiments", "list", "--json")
    assert listing.returncode == 0, listing.stderr
    rows = {r["id"]: r for r in json.loads(listing.stdout)}
    assert {i: r["status"] for i, r in rows.items()} == {1: "stopped", 2: "running"}
    assert rows[1]["message"] == "first" and rows[2]["message"] == "second"
    for i in (1, 2):
        assert rows[i]["revision"] == before[i].revision and rows[i]["command"] == before[i].command
        assert rows[i]["machine"] == before[i].machine and rows[i]["batching"] == before[i].batching
    with project.registry() as reg:
        assert reg.registry_id == registry_id  # the run folders are still this registry's

    stop = project.run("stop")  # the rebuilt registry drives the running experiment as before
    assert stop.returncode == 0 and "experiment 2" in stop.stdout, (stop.stdout, stop.stderr)
    nxt = project.run("deploy", "-m", "third", *QUIET_FLAGS)
    assert nxt.returncode == 0 and "experiment 3" in nxt.stdout + nxt.stderr, nxt.stderr
    assert project.run("stop").returncode == 0

    again = project.run("experiments", "rebuild")  # a readable registry is never replaced
    assert again.returncode == 2 and "is readable" in again.stderr
