"""The agent through its real entry point: the zipapp, run as a process, one envelope per call."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.agent.protocol import frame, manifest_id, unframe
from orchestrator.reach.agent_client import AgentClient, Op, agent_zip
from orchestrator.errors import AgentError, InputError, NotFoundError, SafetyError
from orchestrator.reach.transport.local import LocalTransport


@pytest.fixture
def agent(tmp_path):
    client = AgentClient(LocalTransport(), str(tmp_path / "root"), sys.executable)
    yield client
    from tests.conftest import tmux_socket
    subprocess.run(["tmux", "-L", tmux_socket(str(tmp_path / "root")), "kill-server"], capture_output=True)


def blob(data: bytes) -> dict:
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def test_agent_is_pushed_once_then_reused(agent):
    assert agent.one("hello")["protocol"] == 1
    assert agent.pushes == 1
    agent.one("hello")
    assert agent.pushes == 1 and agent.calls == 3  # first call failed fast, pushed, repeated; then one call
    digest, data = agent_zip()
    assert Path(agent.agent_path).read_bytes() == data and digest in agent.agent_path


def test_envelope_survives_shell_noise():
    payload = {"v": 1, "results": [{"ok": True, "value": 1}]}
    noisy = b"Welcome to Debian\nlast login ...\n" + frame(payload) + b"\nbye\n"
    assert unframe(noisy) == payload
    assert unframe(b"no envelope here") is None


def test_blobs_are_verified_and_revisions_are_atomic_and_immutable(agent, tmp_path):
    a, b = b"print('a')\n", b"print('b')\n"
    files = [{"path": "train.py", **blob(a), "mode": 0o644}, {"path": "lib/util.py", **blob(b), "mode": 0o755}]
    rev = manifest_id(files)
    missing = agent.one("blobs_missing", hashes=[f["sha256"] for f in files])["missing"]
    assert sorted(missing) == sorted(f["sha256"] for f in files)
    # damaged payload: refused, nothing stored
    with pytest.raises(AgentError, match="damaged"):
        agent.call([Op("blobs_store", {"blobs": [blob(a)]})], payload=b"print('x')\n")
    assert len(agent.one("blobs_missing", hashes=[f["sha256"] for f in files])["missing"]) == 2
    # an interrupted push (only the first blob arrived): no revision becomes visible
    agent.call([Op("blobs_store", {"blobs": [blob(a)]})], payload=a)
    with pytest.raises(AgentError, match="missing on the target"):
        agent.one("revision_assemble", revision=rev, files=files)
    revisions = tmp_path / "root" / "revisions"
    assert [p.name for p in revisions.iterdir()] == []
    # the next push sends only what is missing and completes it
    assert agent.one("blobs_missing", hashes=[f["sha256"] for f in files])["missing"] == [blob(b)["sha256"]]
    agent.call([Op("blobs_store", {"blobs": [blob(b)]}), Op("revision_assemble", {"revision": rev, "files": files})],
               payload=b)
    built = revisions / rev
    assert (built / "train.py").read_bytes() == a and (built / "lib" / "util.py").read_bytes() == b
    # read-only hard links to the blobs: no copy, and an immutable revision cannot be edited in place
    assert os.stat(built / "lib" / "util.py").st_mode & 0o777 == 0o555
    assert os.stat(built / "train.py").st_mode & 0o777 == 0o444
    assert os.stat(built / "train.py").st_ino == os.stat(tmp_path / "root" / "blobs" / blob(a)["sha256"]).st_ino
    # sealed: no folder of it takes a new file, whoever runs there (a run works in its own folder)
    assert [os.stat(d).st_mode & 0o777 for d in (built, built / "lib")] == [0o555, 0o555]
    assert os.stat(built / ".orch-manifest.json").st_mode & 0o777 == 0o444
    again = agent.one("revision_assemble", revision=rev, files=files)
    assert again["created"] is False
    with pytest.raises(InputError, match="does not hash"):
        agent.one("revision_assemble", revision="0" * 16, files=files)
    evil = [{"path": "../escape.py", **blob(a), "mode": 0o644}]
    with pytest.raises(InputError, match="escapes"):
        agent.one("revision_assemble", revision=manifest_id(evil), files=evil)
    assert not (tmp_path / "root" / "escape.py").exists()


def test_log_reads_resume_by_offset_and_detect_truncation(agent, tmp_path):
    run = tmp_path / "root" / "runs" / "5"
    run.mkdir(parents=True)
    (run / "experiment.json").write_text(json.dumps({"id": 5, "project": "p"}))
    log = run / "train.log"
    log.write_bytes(b"one\ntwo\nthree\npartial")
    first = agent.one("log_read", exp_id=5, tail_lines=2)
    import base64
    assert base64.b64decode(first["data"]) == b"three\npartial"
    with log.open("ab") as fh:
        fh.write(b" line\nfour\n")
    nxt = agent.one("log_read", exp_id=5, offset=first["offset"], identity=first["identity"])
    assert base64.b64decode(nxt["data"]) == b" line\nfour\n" and not nxt["reset"]
    log.write_bytes(b"new\n")  # truncated in place
    again = agent.one("log_read", exp_id=5, offset=nxt["offset"], identity=nxt["identity"])
    assert again["reset"] and base64.b64decode(again["data"]) == b"new\n"
    with pytest.raises(NotFoundError):
        agent.one("log_read", exp_id=99, offset=0)


def test_checkpoint_paths_are_checked_before_anything_moves(agent, tmp_path):
    root = tmp_path / "root"
    ck = tmp_path / "ckpt"
    ck.mkdir()
    (ck / "a.pt").write_bytes(b"a")
    for bad in ("/", "/etc", "/usr/share", "relative/path", ""):
        with pytest.raises(SafetyError):
            agent.one("ckpt_trash", path=bad, configured=bad, label="x")
    with pytest.raises(SafetyError, match="not the checkpoint folder"):
        agent.one("ckpt_trash", path=str(ck), configured=str(tmp_path / "other"), label="x")
    with pytest.raises(SafetyError, match="overlaps"):
        agent.one("ckpt_trash", path=str(root), configured=str(root), label="x")
    with pytest.raises(SafetyError, match="overlaps"):
        agent.one("ckpt_trash", path=str(root / "runs"), configured=str(root / "runs"), label="x")
    assert (ck / "a.pt").read_bytes() == b"a"
    moved = agent.one("ckpt_trash", path=str(ck), configured=str(ck), label="exp1")
    assert moved["action"] == "moved" and not list(ck.iterdir())
    (ck / "a.pt").write_bytes(b"new")
    with pytest.raises(SafetyError, match="already exist"):
        agent.one("ckpt_restore", path=str(ck), configured=str(ck), name=moved["entry"])
    assert (ck / "a.pt").read_bytes() == b"new"


def test_trash_retention_purges_oldest_beyond_the_limit(agent, tmp_path):
    ck = tmp_path / "ckpt"
    ck.mkdir()
    names = []
    for i in range(4):
        (ck / f"{i}.pt").write_bytes(b"x" * 10)
        res = agent.one("ckpt_trash", path=str(ck), configured=str(ck), label=f"exp{i}", keep=2)
        names.append(res["entry"])
    left = sorted(p.name for p in (tmp_path / "ckpt.trash").iterdir())
    assert left == sorted(names[-2:])


def test_preflight_reports_the_target(agent):
    pf = agent.one("preflight")
    assert pf["python"].startswith("3.") and pf["tmux"].startswith("tmux") and pf["free_mb"] > 0
    assert isinstance(pf["gpus"], list)


def test_an_old_interpreter_gets_a_clear_error(tmp_path):
    """The zip's bootstrap is parsed by any python3; simulate 3.8 by faking version_info."""
    digest, data = agent_zip()
    zp = tmp_path / "agent.pyz"
    zp.write_bytes(data)
    code = ("import sys, runpy; sys.version_info = (3, 8, 0, 'final', 0); sys.argv = [%r]; "
            "runpy.run_path(%r, run_name='__main__')" % (str(zp), str(zp)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True)
    env = unframe(out.stdout)
    assert env and "needs 3.10 or newer" in env["fatal"]["message"]


def test_gpus_come_from_nvidia_smi_when_present(agent, tmp_path, monkeypatch):
    """The nvidia-smi stand-in on PATH (the real one needs a GPU), answering in nvidia-smi's CSV format."""
    from tests.testbed.gpu_standin import gpu_state, gpu_uuid, install_local

    state = gpu_state(2, seed=5, apps={0: [4411]}, name="NVIDIA A100-SXM4-80GB")
    for key, value in install_local(tmp_path / "smi", state).items():
        monkeypatch.setenv(key, value)
    gpus = agent.one("status")["gpus"]
    assert [g["index"] for g in gpus] == ["0", "1"] and gpus[0]["util"] == "87"
    assert gpus[1]["mem_total_mib"] == "81559" and gpus[1]["uuid"] == gpu_uuid(5, 1)
    assert gpus[0]["name"] == "NVIDIA A100-SXM4-80GB" and gpus[0]["power_w"] == "312.50"
    assert agent.one("preflight")["gpus"] == gpus
    report = agent.one("gpus")
    assert report["driver_version"] == "550.127.05" and report["error"] is None
    assert report["apps"] == [{"pid": "4411", "gpu_uuid": gpu_uuid(5, 0), "process_name": "python3",
                               "mem_used_mib": "1024", "owner": None}]
    install_local(tmp_path / "smi", {**state, "mismatch": True})
    report = agent.one("gpus")
    assert report["gpus"] == [] and report["exit_code"] == 18
    assert report["error"] == "Failed to initialize NVML: Driver/library version mismatch"
    assert agent.one("status")["gpus"] == []


def test_old_agent_versions_are_pruned_but_never_current_recent_or_in_use(agent, tmp_path):
    agent.one("hello")
    folder = tmp_path / "root" / "agent"
    old_zip, old_dir = folder / "agent-0000000000000000.pyz", folder / "agent-0000000000000000.d"
    recent = folder / "agent-1111111111111111.pyz"
    used_zip, used_dir = folder / "agent-2222222222222222.pyz", folder / "agent-2222222222222222.d"
    for p in (old_zip, recent, used_zip):
        p.write_bytes(b"zip")
    for d in (old_dir, used_dir):
        d.mkdir()
        (d / "x.py").write_text("")
    day_ago = __import__("time").time() - 2 * 86400
    for p in (old_zip, old_dir, used_zip, used_dir):
        os.utime(p, (day_ago, day_ago))
    # a live run whose PYTHONPATH points at the "used" version
    run = tmp_path / "root" / "runs" / "3"
    run.mkdir(parents=True)
    (run / "experiment.json").write_text(json.dumps({"id": 3, "project": "p"}))
    (run / "launch.json").write_text(json.dumps({"env": {"PYTHONPATH": str(used_dir)}, "created": 0}))
    (run / "pid.json").write_text(json.dumps({"child": os.getpid(), "started": 0}))
    pruned = agent.one("preflight")["pruned_agents"]
    assert sorted(pruned) == [old_dir.name, old_zip.name]
    assert recent.exists() and used_zip.exists() and used_dir.exists()
    assert Path(agent.agent_path).exists()


def test_trash_entries_record_the_experiment_that_moved_them(agent, tmp_path):
    ck = tmp_path / "ckpt"
    ck.mkdir()
    (ck / "a.pt").write_bytes(b"a")
    moved = agent.one("ckpt_trash", path=str(ck), configured=str(ck), label="exp6", moved_by=7)
    (ck / "b.pt").write_bytes(b"b")
    agent.one("ckpt_trash", path=str(ck), configured=str(ck), label="manual")
    entries = agent.one("ckpt_inventory", path=str(ck), configured=str(ck))["entries"]
    assert [(e["experiment"], e["moved_by"], e["trash"]) for e in entries] == \
        [("exp6", 7, str(tmp_path / "ckpt.trash")), ("manual", None, str(tmp_path / "ckpt.trash"))]
    meta = json.loads((tmp_path / "ckpt.trash" / moved["entry"] / ".orch-trash.json").read_text())
    assert meta["moved_by"] == 7 and meta["experiment"] == "exp6"


def test_retention_deletes_only_confirmed_entries_and_purge_only_confirmed_files(agent, tmp_path):
    ck = tmp_path / "ckpt"
    ck.mkdir()
    args = {"path": str(ck), "configured": str(ck)}
    names = []
    for i in range(2):
        (ck / f"{i}.pt").write_bytes(b"x" * 10)
        names.append(agent.one("ckpt_trash", **args, label=f"exp{i}")["entry"])
    first = names[0]
    (ck / "2.pt").write_bytes(b"y")
    inv = agent.one("ckpt_inventory", **args, keep=2)
    assert [d["entry"] for d in inv["retention"]] == [first]  # what a clean now would delete, to be confirmed
    kept = agent.one("ckpt_trash", **args, label="exp2", keep=2, retention_allowed=[])
    assert kept["purged"] == [] and len(list((tmp_path / "ckpt.trash").iterdir())) == 3
    (ck / "3.pt").write_bytes(b"z")
    done = agent.one("ckpt_trash", **args, label="exp3", keep=2, retention_allowed=[first])
    assert [p["entry"] for p in done["purged"]] == [first]  # the other one due is left: it was not confirmed

    (ck / "old.pt").write_bytes(b"old")
    (ck / "sub").mkdir()
    (ck / "sub" / "old.pt").write_bytes(b"old")
    inv = agent.one("ckpt_inventory", **args, full=True)
    (ck / "final.pt").write_bytes(b"written after the confirmation")
    res = agent.one("ckpt_trash", **args, label="exp4", purge=True, purge_only=inv["all_files"])
    assert res["deleted"] == 2 and res["kept"] == ["final.pt"]
    entry = Path(res["entry_path"])
    assert sorted(p.name for p in entry.iterdir()) == [".orch-trash.json", "final.pt"] and not list(ck.iterdir())
