"""The agent's side of ``orch pull`` (``files_manifest``, ``files_send``), through the real agent on this machine:
what it lists, what it refuses to read, and the frames it sends."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from orchestrator.errors import InputError, SafetyError
from orchestrator.reach.agent_client import AgentClient, Op
from orchestrator.reach.transport.local import LocalTransport

REGISTRY = "0123456789ab"


def _run(tmp_path: Path) -> tuple[AgentClient, Path, Path]:
    root, ck = tmp_path / "root", tmp_path / "ck"
    run_dir = root / "runs" / f"{REGISTRY}-3"
    (run_dir / "work" / "out").mkdir(parents=True)
    (run_dir / "train.log").write_bytes(b"step=1 loss=2.0\n")
    (run_dir / "work" / "out" / "eval.json").write_text('{"loss": 2.0}')
    ck.mkdir()
    (ck / "ckpt-000001.pt").write_bytes(os.urandom(3 << 20))
    secret = tmp_path / "secret.txt"
    secret.write_text("not the run's\n")
    return AgentClient(LocalTransport(), str(root)), run_dir, ck


def _sel(ck: Path, **extra) -> dict:
    return {"exp_id": 3, "registry": REGISTRY, "checkpoints": str(ck), "outputs": True, "log": True, **extra}


def test_links_are_listed_as_skipped_and_never_read(tmp_path):
    client, run_dir, ck = _run(tmp_path)
    out = run_dir / "work" / "out"
    os.symlink(tmp_path / "secret.txt", out / "leak.txt")
    os.symlink(tmp_path, out / "up")
    os.symlink(tmp_path / "secret.txt", ck / "leak.pt")
    listed = client.one("files_manifest", **_sel(ck), hash=["*"])
    keys = {f["key"] for f in listed["files"]}
    assert keys == {"checkpoints/ckpt-000001.pt", "outputs/out/eval.json", "train.log"}
    assert {s["key"]: s["why"] for s in listed["skipped"]} == {
        "outputs/out/leak.txt": "a symlink", "outputs/out/up": "a symlink to a folder",
        "checkpoints/leak.pt": "a symlink"}
    assert {f["key"]: f["sha256"] for f in listed["files"]}["checkpoints/ckpt-000001.pt"] == \
        hashlib.sha256((ck / "ckpt-000001.pt").read_bytes()).hexdigest()


@pytest.mark.parametrize("key, error, said", [
    ("outputs/out/leak.txt", SafetyError, "through a symlink: not sent"),
    ("outputs/up/secret.txt", SafetyError, "through a symlink: not sent"),
    ("outputs/out/../../../secret.txt", InputError, "not a plain path inside its folder")])
def test_a_link_or_an_escape_asked_for_by_name_is_refused(tmp_path, key, error, said):
    client, run_dir, ck = _run(tmp_path)
    os.symlink(tmp_path / "secret.txt", run_dir / "work" / "out" / "leak.txt")
    os.symlink(tmp_path, run_dir / "work" / "up")
    sent: list[bytes] = []
    with pytest.raises(error, match=said):
        client.call([Op("files_send", {**_sel(ck), "files": [{"key": key, "offset": 0}]})],
                    on_frame=lambda _h, d: sent.append(d))
    assert b"not the run's" not in b"".join(sent)


def test_a_file_is_sent_whole_with_the_hash_of_every_byte_even_from_an_offset(tmp_path):
    client, _run_dir, ck = _run(tmp_path)
    body = (ck / "ckpt-000001.pt").read_bytes()
    got: list[bytes] = []
    ends: list[dict] = []
    client.call([Op("files_send", {**_sel(ck), "files": [{"key": "checkpoints/ckpt-000001.pt", "offset": 1000}]})],
                on_frame=lambda h, d: (got.append(d), h.get("end") and ends.append(h)))
    assert b"".join(got) == body[1000:]
    assert ends == [{"k": 0, "end": True, "size": len(body), "sha256": hashlib.sha256(body).hexdigest(), "n": 0}]


def test_a_symlinked_checkpoint_folder_and_a_bad_glob_are_refused(tmp_path):
    client, _run_dir, ck = _run(tmp_path)
    os.symlink(ck, tmp_path / "ck-link")
    with pytest.raises(SafetyError, match="symlink"):
        client.one("files_manifest", **_sel(tmp_path / "ck-link"))
    with pytest.raises(InputError, match="relative pattern"):
        client.one("files_manifest", **_sel(ck), globs=["../*"])
    with pytest.raises(SafetyError, match="system folder"):
        client.one("files_manifest", **_sel(Path("/etc")))
