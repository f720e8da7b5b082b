"""The agent's gc plan on a hand-made root: other projects, a run's outputs and unknown revisions are safe."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from orchestrator.agent.store.gc import gc, plan
from orchestrator.agent.layout import Layout

OLD = time.time() - 7200


def _blob(root: Path, sha: str, data: bytes) -> Path:
    p = root / "blobs" / sha
    p.write_bytes(data)
    p.chmod(0o444)  # as blob_stream stores them
    return p


def _revision(root: Path, rev: str, files: dict[str, str], manifest: bool = True) -> Path:
    d = root / "revisions" / rev
    d.mkdir(parents=True)
    for path, sha in files.items():
        os.link(root / "blobs" / sha, d / path)
    if manifest:
        entries = [{"path": p, "sha256": s, "mode": 0o644} for p, s in files.items()]
        (d / ".orch-manifest.json").write_text(json.dumps({"revision": rev, "files": entries}))
    return d


def _run(root: Path, exp_id: int, project: str, rev: str, ckpt: str = "") -> None:
    d = root / "runs" / str(exp_id)
    d.mkdir(parents=True)
    (d / "experiment.json").write_text(json.dumps({"id": exp_id, "project": project, "revision": rev,
                                                   "checkpoints": ckpt}))
    (d / "exit.json").write_text(json.dumps({"exit_code": 0, "ended": OLD}))


def _aged(root: Path) -> None:
    for p in [*root.rglob("*")]:
        os.utime(p, (OLD, OLD), follow_symlinks=False)


def test_plan_keeps_other_projects_outputs_and_unknown_revisions(tmp_path: Path):
    root = tmp_path / "root"
    layout = Layout(str(root))
    layout.ensure()
    a, b, c, d, e = ("a" * 64, "b" * 64, "c" * 64, "d" * 64, "e" * 64)
    for sha in (a, b, c, d, e):
        _blob(root, sha, sha.encode())
    _revision(root, "1" * 16, {"x.py": a})             # project p, old: goes
    _revision(root, "2" * 16, {"x.py": b})             # project p, latest: stays
    _revision(root, "3" * 16, {"x.py": c})             # project q, old: stays (not ours)
    outputs = _revision(root, "4" * 16, {"x.py": d})   # unreferenced, but a run wrote into it: stays
    (outputs / "model.pt").write_bytes(b"weights")
    _run(root, 1, "p", "1" * 16)
    _run(root, 2, "p", "2" * 16)
    _run(root, 3, "q", "3" * 16)
    _aged(root)
    res = plan(layout, "p", keep=1)
    items = {(i["kind"], i["name"]) for i in res["items"]}
    assert items == {("run", "1"), ("revision", "1" * 16), ("blob", a), ("blob", e)}
    kept = {i["name"]: i["why"] for i in res["kept"]}
    assert "manifest does not list (model.pt)" in kept["4" * 16] and "then run orch gc again" in kept["4" * 16]
    assert kept["3" * 16] == "used by experiment 3 of project q (finished)"
    assert kept["2" * 16] == "used by experiment 2 (finished)" and kept["2"] == "the latest experiment"
    extra = sum(f.stat().st_size for f in [root / "revisions" / ("1" * 16) / ".orch-manifest.json",
                                           *(root / "runs" / "1").iterdir()])
    assert res["freed"] == len(a) + len(e) + extra  # the revision's x.py is a link to blob a: counted once

    _revision(root, "5" * 16, {"y.py": e}, manifest=False)  # unknown contents: every blob stays
    _aged(root)
    assert not [i for i in plan(layout, "p", keep=1)["items"] if i["kind"] == "blob"]


def test_a_checkpoint_folder_inside_a_run_folder_is_never_removed(tmp_path: Path):
    root = tmp_path / "root"
    layout = Layout(str(root))
    layout.ensure()
    _run(root, 1, "p", "1" * 16, ckpt=str(root / "runs" / "1" / "ckpt"))
    (root / "runs" / "1" / "ckpt").mkdir()
    (root / "runs" / "1" / "ckpt" / "step10.pt").write_bytes(b"w")
    _run(root, 2, "p", "2" * 16)
    _aged(root)
    res = gc(layout, "p", keep=1, dry_run=False)
    assert not res["items"] and res["kept"][0]["why"] == "holds a checkpoint folder"
    assert (root / "runs" / "1" / "ckpt" / "step10.pt").exists()


def test_the_journal_of_a_launch_that_never_started_is_collected_with_its_project(tmp_path: Path):
    from orchestrator.agent.journal import Journal

    root = tmp_path / "root"
    layout = Layout(str(root))
    layout.ensure()
    for n in (1, 2, 3):
        _run(root, n, "p", "")
    for n, project in ((4, "p"), (5, "q")):  # refused before their start: only their journals are there
        steps = Journal(str(root / "runs" / str(n)))
        steps.begin("deploy", ["run_check", "run_start"], exp_id=n, project=project)
        steps.end()
    _aged(root)
    doomed = {item["name"] for item in plan(layout, "p", keep=1)["items"] if item["kind"] == "run"}
    assert doomed == {"1", "2", "4"}  # a journal alone never counts as a recent run; q's is not p's to collect
    doomed = {item["name"] for item in plan(layout, "q", keep=0)["items"] if item["kind"] == "run"}
    assert doomed == {"5"}
