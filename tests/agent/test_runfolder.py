"""A run's work folder and a sealed revision on a real root: links not copies, nothing written into the
revision, and gc telling changed or foreign revision files apart from what it can free."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from orchestrator.agent.run import workdir
from orchestrator.agent.store import revisions
from orchestrator.agent.store.gc import gc, plan
from orchestrator.agent.layout import Layout, remove_tree
from orchestrator.agent.protocol import AgentFailure, manifest_id

OLD = time.time() - 7200


def _revision(layout: Layout, tree: dict[str, tuple[bytes, int]]) -> tuple[str, list]:
    """Store the blobs of ``tree`` (path -> (content, mode)) as a push would, then assemble the revision."""
    layout.ensure()
    files = []
    for path, (data, mode) in tree.items():
        sha = hashlib.sha256(data).hexdigest()
        blob = Path(layout.blob(sha))
        if not blob.exists():
            blob.write_bytes(data)
            blob.chmod(0o444)
        files.append({"path": path, "sha256": sha, "mode": mode, "size": len(data)})
    rev = manifest_id(files)
    revisions.revision_assemble(layout, rev, files)
    return rev, files


def _age(root: Path) -> None:
    for p in [root, *root.rglob("*")]:
        os.utime(p, (OLD, OLD), follow_symlinks=False)


def _run(layout: Layout, key: str, project: str, rev: str) -> Path:
    import json

    d = Path(layout.runs) / key
    d.mkdir(parents=True)
    (d / "experiment.json").write_text(json.dumps({"project": project, "revision": rev}))
    (d / "exit.json").write_text(json.dumps({"exit_code": 0, "ended": OLD}))
    return d


TREE = {"train.py": (b"import model\n", 0o644), "model.py": (b"class GPT: pass\n", 0o644),
        "config/small.py": (b"n_layer = 2\n", 0o644), "run.sh": (b"#!/bin/sh\n", 0o755)}


def test_the_work_folder_links_the_revision_and_takes_what_the_run_writes(tmp_path: Path):
    layout = Layout(str(tmp_path / "root"))
    rev, _files = _revision(layout, TREE)
    run_dir = tmp_path / "root" / "runs" / "abcdef012345-1"
    run_dir.mkdir(parents=True)
    work = Path(workdir.build(layout, str(run_dir), rev))
    assert work == run_dir / "work"
    rev_dir = Path(layout.revision(rev))
    for path in TREE:
        assert os.stat(work / path).st_ino == os.stat(rev_dir / path).st_ino  # a link: no byte copied
    assert os.stat(work / "run.sh").st_mode & 0o777 == 0o555 and os.stat(work / "train.py").st_mode & 0o777 == 0o444
    assert os.stat(work / "config").st_mode & 0o777 == 0o755 and not (work / ".orch-manifest.json").exists()
    (work / "out").mkdir()
    (work / "out" / "ckpt.pt").write_bytes(b"w")
    (work / "config" / "local.py").write_text("x = 1\n")
    assert sorted(p.name for p in rev_dir.rglob("*")) == sorted([".orch-manifest.json", "config", *(
        Path(p).name for p in TREE)])
    assert workdir.build(layout, str(run_dir), rev) == str(work)  # a later attempt keeps what the first wrote
    assert (work / "out" / "ckpt.pt").read_bytes() == b"w"
    assert not [p for p in run_dir.iterdir() if p.name.startswith(".tmp-")]


def test_building_a_work_folder_of_2000_files_copies_nothing(tmp_path: Path):
    layout = Layout(str(tmp_path / "root"))
    tree = {f"pkg{i // 100}/m{i}.py": (f"x = {i}\n".encode(), 0o644) for i in range(2000)}
    rev, _files = _revision(layout, tree)
    run_dir = tmp_path / "root" / "runs" / "1"
    run_dir.mkdir(parents=True)
    work = Path(workdir.build(layout, str(run_dir), rev))
    linked = [p for p in work.rglob("*") if p.is_file()]
    assert len(linked) == 2000 and all(p.stat().st_nlink == 3 for p in linked)  # blob, revision, work folder


def test_gc_frees_a_revision_with_only_bytecode_caches_and_keeps_one_with_outputs(tmp_path: Path):
    root = tmp_path / "root"
    layout = Layout(str(root))
    cached, _ = _revision(layout, {"a.py": (b"a\n", 0o644)})
    outputs, _ = _revision(layout, {"b.py": (b"b\n", 0o644)})
    for rev in (cached, outputs):  # as an older orch left them: writable, a run's files inside
        os.chmod(layout.revision(rev), 0o755)
    (Path(layout.revision(cached)) / "__pycache__").mkdir()
    (Path(layout.revision(cached)) / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"pyc")
    (Path(layout.revision(outputs)) / "out").mkdir()
    (Path(layout.revision(outputs)) / "out" / "ckpt.pt").write_bytes(b"weights")
    _age(root)
    res = gc(layout, "p", keep=0, dry_run=False)
    assert ("revision", cached) in {(i["kind"], i["name"]) for i in res["items"]}
    assert not os.path.exists(layout.revision(cached))
    why = {k["name"]: k["why"] for k in res["kept"]}[outputs]
    assert "(out/ckpt.pt)" in why and "older orch" in why and layout.revision(outputs) in why
    assert (Path(layout.revision(outputs)) / "out" / "ckpt.pt").read_bytes() == b"weights"


def test_gc_says_which_experiment_keeps_a_revision_and_frees_it_once_none_does(tmp_path: Path):
    root = tmp_path / "root"
    layout = Layout(str(root))
    rev, _ = _revision(layout, TREE)
    _run(layout, "abcdef012345-14", "p", rev)
    _age(root)
    kept = {(k["kind"], k["name"]): k["why"] for k in plan(layout, "p", keep=1)["kept"]}
    assert kept[("revision", rev)] == "used by experiment 14 (finished)"
    assert kept[("run", "14")] == "the latest experiment"
    res = gc(layout, "p", keep=0, dry_run=False)
    assert {(i["kind"], i["name"]) for i in res["items"]} >= {("run", "14"), ("revision", rev)}
    assert not os.listdir(layout.revisions) and not os.listdir(layout.blobs) and not os.listdir(layout.runs)


def test_gc_reports_a_revision_file_changed_in_place_and_stops_trusting_its_blob(tmp_path: Path):
    root = tmp_path / "root"
    layout = Layout(str(root))
    rev, files = _revision(layout, TREE)
    run = _run(layout, "abcdef012345-3", "p", rev)
    work = Path(workdir.build(layout, str(run), rev))
    _age(root)
    os.chmod(work / "model.py", 0o644)  # what a root run does without asking: write into its linked file
    (work / "model.py").write_bytes(b"class GPT: changed = True\n")
    res = plan(layout, "p", keep=1)
    sha = next(f["sha256"] for f in files if f["path"] == "model.py")
    assert [(c["revision"], c["path"], c["why"]) for c in res["changed"]] == [(rev, "model.py", "content changed")]
    assert {"kind": "blob", "name": sha, "path": layout.blob(sha), "why": "changed in place",
            "bytes": len(b"class GPT: changed = True\n")} in res["items"]
    gc(layout, "p", keep=1, dry_run=False)
    assert not os.path.exists(layout.blob(sha))  # the next deploy sends model.py again, never links this one
    assert os.path.isdir(layout.revision(rev)) and (work / "model.py").exists()  # the run keeps what it wrote
    assert [c["path"] for c in plan(layout, "p", keep=1)["changed"]] == ["model.py"]  # still said, never trusted
    Path(layout.blob(sha)).write_bytes(TREE["model.py"][0])  # sent again (for another revision, say)
    os.chmod(layout.blob(sha), 0o444)
    os.utime(layout.blob(sha), (OLD, OLD))
    assert not [i for i in plan(layout, "p", keep=1)["items"] if i["kind"] == "blob"]  # the fresh blob is trusted
    os.unlink(layout.blob(sha))

    with pytest.raises(AgentFailure, match="changed in place") as refused:  # a restart of it: refused
        revisions.revision_assemble(layout, rev)
    assert refused.value.kind == "safety" and "model.py" in refused.value.message
    with pytest.raises(AgentFailure, match="missing on the target"):  # a deploy of it first sends model.py again
        revisions.revision_assemble(layout, rev, files)
    Path(layout.blob(sha)).write_bytes(TREE["model.py"][0])
    os.chmod(layout.blob(sha), 0o444)
    assert revisions.revision_assemble(layout, rev, files)["created"] is True
    rebuilt = Path(layout.revision(rev)) / "model.py"
    assert rebuilt.read_bytes() == TREE["model.py"][0] and rebuilt.stat().st_ino == os.stat(layout.blob(sha)).st_ino
    assert not os.path.exists(revisions.changed_marker(layout, rev)) and plan(layout, "p", keep=1)["changed"] == []
    assert (work / "model.py").read_bytes() == b"class GPT: changed = True\n"  # the run's own copy stays its own


def test_an_untouched_revision_audits_clean_however_old(tmp_path: Path):
    layout = Layout(str(tmp_path / "root"))
    rev, files = _revision(layout, TREE)
    _age(tmp_path / "root")
    found = revisions.audit(layout.revision(rev), files)
    assert found == {"changed": [], "foreign": [], "caches": []}


def test_removal_never_reaches_outside_the_root(tmp_path: Path):
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "f").write_text("keep")
    root = tmp_path / "root"
    root.mkdir()
    (root / "link").symlink_to(outside)
    for path in (str(outside), str(root / "link" / "f"), str(root), str(root / ".." / "precious")):
        with pytest.raises(AgentFailure):
            remove_tree(str(root), path)
    assert (outside / "f").read_text() == "keep"


AS_USER = """\
import json, os, sys, time
sys.path.insert(0, sys.argv[2])
from pathlib import Path
from orchestrator.agent.run import workdir
from orchestrator.agent.store import revisions
from orchestrator.agent.store.gc import gc
from orchestrator.agent.layout import Layout
from orchestrator.agent.protocol import manifest_id
import hashlib
layout = Layout(sys.argv[1])
layout.ensure()
files = []
for path, data in {"train.py": b"t\\n", "config/a.py": b"a\\n"}.items():
    sha = hashlib.sha256(data).hexdigest()
    Path(layout.blob(sha)).write_bytes(data)
    os.chmod(layout.blob(sha), 0o444)
    files.append({"path": path, "sha256": sha, "mode": 0o644, "size": len(data)})
rev = manifest_id(files)
revisions.revision_assemble(layout, rev, files)
run = Path(layout.runs, "abcdef012345-1")
run.mkdir()
(run / "experiment.json").write_text(json.dumps({"project": "p", "revision": rev}))
(run / "exit.json").write_text(json.dumps({"exit_code": 0, "ended": 1}))
work = Path(workdir.build(layout, str(run), rev))
refused = []
for what, act in (("add", lambda: Path(layout.revision(rev), "config", "n.txt").write_text("x")),
                  ("write", lambda: open(work / "config" / "a.py", "w"))):
    try:
        act()
    except PermissionError:
        refused.append(what)
(work / "out").mkdir()
(work / "out" / "ckpt.pt").write_text("1")
old = time.time() - 7200
for p in [Path(sys.argv[1]), *Path(sys.argv[1]).rglob("*")]:
    os.utime(p, (old, old), follow_symlinks=False)
gc(layout, "p", keep=0, dry_run=False)
print(json.dumps({"refused": refused, "left": sorted(os.listdir(layout.revisions) + os.listdir(layout.runs)
                                                    + os.listdir(layout.blobs))}))
"""


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"),
                    reason="needs root, to run the agent's code as another user (nobody)")
def test_as_a_user_that_is_not_root_the_revision_refuses_writes_and_gc_still_frees_it():
    import json
    import shutil
    import subprocess
    import tempfile

    repo = Path(__file__).resolve().parents[2]
    folder = tempfile.mkdtemp(prefix="orch-nobody-", dir="/tmp")
    try:
        shutil.chown(folder, "nobody")
        res = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "/usr/bin/python3",
                              "-B", "-c", AS_USER, os.path.join(folder, "root"), str(repo)],
                             capture_output=True, text=True, timeout=60, cwd="/")
        assert res.returncode == 0, res.stderr
        found = json.loads(res.stdout)
        assert found == {"refused": ["add", "write"], "left": []}  # sealed folders removed without root's rights
    finally:
        shutil.rmtree(folder, ignore_errors=True)
