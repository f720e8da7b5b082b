"""A run works in a folder of its own on the local target (real CLI, tmux, SQLite): the revision stays exactly
what was pushed, what the run writes stays with the run, a restart attempt finds it, and gc says who keeps what."""

from __future__ import annotations

import hashlib
import json
import stat
import subprocess
from pathlib import Path

from tests.cli.test_gc import _age
from tests.cli.test_into import cli_argv
from tests.cli.test_lifecycle import wait_status

# nanoGPT's habits: a sibling module imported, a config read by relative path, out/ckpt.pt in its cwd resumed
TRAIN = """\
import json, os, pathlib, sys
from model import GPT
exec(open("config/small.py").read())
out = pathlib.Path("out")
out.mkdir(exist_ok=True)
ckpt = out / "ckpt.pt"
resumed = ckpt.read_text() if ckpt.exists() else None
ckpt.write_text("attempt " + os.environ["ORCH_ATTEMPT"])
pathlib.Path("data/cache.bin").write_bytes(b"tokens cached")
seen = {"cwd": os.getcwd(), "work": os.environ.get("ORCH_WORK_DIR"), "run": os.environ["ORCH_RUN_DIR"],
        "resumed": resumed, "prefix": sys.pycache_prefix, "n_layer": n_layer, "gpt": GPT.name}
with open(out / "seen.jsonl", "a") as fh:
    fh.write(json.dumps(seen) + "\\n")
print("step=1 loss=1.0", flush=True)
sys.exit(1 if os.environ["ORCH_ATTEMPT"] == "0" else 0)
"""
SOURCES = {"train.py": TRAIN, "model.py": "class GPT:\n    name = 'gpt'\n", "config/small.py": "n_layer = 2\n",
           "data/tokens.txt": "hello\n"}


def _write(project) -> None:
    for rel, text in SOURCES.items():
        (project.path / rel).parent.mkdir(parents=True, exist_ok=True)
        (project.path / rel).write_text(text)


def assert_pristine(rev_dir: Path) -> None:
    """The revision folder holds exactly its manifest's files, byte for byte, every entry read-only."""
    manifest = json.loads((rev_dir / ".orch-manifest.json").read_text())["files"]
    present = {str(p.relative_to(rev_dir)) for p in rev_dir.rglob("*") if not p.is_dir()}
    assert present == {f["path"] for f in manifest} | {".orch-manifest.json"}
    for f in manifest:
        path = rev_dir / f["path"]
        assert hashlib.sha256(path.read_bytes()).hexdigest() == f["sha256"]
        assert stat.S_IMODE(path.stat().st_mode) == (0o555 if f["mode"] & 0o111 else 0o444)
    for d in [rev_dir, *(p for p in rev_dir.rglob("*") if p.is_dir())]:
        assert stat.S_IMODE(d.stat().st_mode) == 0o555, d


def test_a_run_writes_in_its_own_folder_and_a_restart_attempt_finds_it(project, monkeypatch):
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)  # the run writes bytecode, as by default
    _write(project)
    res = project.cli("deploy", "--json", "--set", "project.sources=['train.py','model.py','config','data']",
                      "--set", "run.restarts=1", "--set", "run.backoff=[0.2]")
    assert res.exit_code == 0, res.output
    exp = json.loads(res.stdout)["experiment"]
    wait_status(project, exp["id"], ("finished",))
    run_dir = project.run_dir(exp["id"])
    work = run_dir / "work"
    rev_dir = project.root / "revisions" / exp["revision"]

    assert_pristine(rev_dir)
    seen = [json.loads(line) for line in (work / "out" / "seen.jsonl").read_text().splitlines()]
    assert [s["resumed"] for s in seen] == [None, "attempt 0"]  # the second attempt resumed from its cwd
    assert {s["cwd"] for s in seen} == {s["work"] for s in seen} == {str(work)}
    assert {s["run"] for s in seen} == {str(run_dir)} and seen[0]["n_layer"] == 2 and seen[0]["gpt"] == "gpt"
    assert seen[0]["prefix"] is None  # no prefix of orch's: installed packages keep their own bytecode caches
    assert (work / "out" / "ckpt.pt").read_text() == "attempt 1"
    assert (work / "data" / "cache.bin").read_bytes() == b"tokens cached"
    assert list((work / "__pycache__").glob("model.*.pyc")), "the imported module's bytecode is in the run folder"
    assert not list(rev_dir.rglob("__pycache__"))
    assert (work / "train.py").stat().st_ino == (rev_dir / "train.py").stat().st_ino  # linked, not copied

    ls = subprocess.run(cli_argv("exec", "--", "ls"), cwd=project.path, capture_output=True, text=True, timeout=60)
    assert ls.returncode == 0, ls.stderr
    assert {"out", "train.py", "model.py", "config", "data"} <= set(ls.stdout.split())

    kept = project.cli("gc", "--keep", "1", "--dry-run")
    assert kept.exit_code == 0, kept.output
    assert f"revision {exp['revision']}: used by experiment {exp['id']} (finished)" in kept.stdout
    young = project.cli("gc", "--keep", "0", "--dry-run")
    assert f"revision {exp['revision']}: younger than the grace period" in young.stdout
    _age(project.root / "blobs", project.root / "revisions")
    freed = project.cli("gc", "--keep", "0", "--yes", "--json")
    assert freed.exit_code == 0, freed.output
    removed = {(i["kind"], i["name"]) for i in json.loads(freed.stdout)["items"]}
    assert {("revision", exp["revision"]), ("run", str(exp["id"]))} <= removed
    assert not rev_dir.exists() and not run_dir.exists()
    assert not [p for p in (project.root / "blobs").iterdir()]


def test_a_revision_file_changed_in_place_is_reported_and_rebuilt_by_the_next_deploy(project):
    _write(project)
    sources = ["--set", "project.sources=['train.py','model.py','config','data']"]
    res = project.cli("deploy", "--json", *sources, "--set", "run.restarts=1", "--set", "run.backoff=[0.2]")
    assert res.exit_code == 0, res.output
    exp = json.loads(res.stdout)["experiment"]
    wait_status(project, exp["id"], ("finished",))
    work, rev_dir = project.run_dir(exp["id"]) / "work", project.root / "revisions" / exp["revision"]
    _age(project.root / "blobs", project.root / "revisions")
    (work / "model.py").chmod(0o644)  # a run as root: permission bits do not stop it writing into its link
    (work / "model.py").write_text("class GPT:\n    name = 'changed by the run'\n")

    plan = project.cli("gc", "--keep", "1", "--dry-run")
    assert plan.exit_code == 0, plan.output
    assert f"changed: revision {exp['revision']}: model.py: content changed since it was pushed" in plan.stdout
    assert project.cli("gc", "--keep", "1", "--yes").exit_code == 0

    refused = project.cli("restart")
    assert refused.exit_code == 6, refused.output
    assert f"error: revision {exp['revision']} was changed in place on the target (model.py" in refused.output
    assert "hint: deploy again from the same code" in refused.output
    res = project.cli("deploy", "--json", *sources)
    assert res.exit_code == 0, res.output
    again = json.loads(res.stdout)["experiment"]
    assert again["revision"] == exp["revision"]
    wait_status(project, again["id"], ("crashed", "finished"))
    assert_pristine(rev_dir)
    assert (rev_dir / "model.py").read_text() == SOURCES["model.py"]
    assert "changed by the run" in (work / "model.py").read_text()  # the first run keeps what it wrote
    clean = project.cli("gc", "--keep", "2", "--dry-run")
    assert clean.exit_code == 0 and "changed:" not in clean.stdout
