"""Roots that belong to the user: a root others could write is refused (exit 6) before anything runs from it."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.agent.protocol import unframe
from orchestrator.reach.agent_client import AgentClient, agent_zip
from orchestrator.errors import SafetyError
from orchestrator.reach.transport.local import LocalTransport

NOBODY = pwd.getpwnam("nobody").pw_uid


def _owned_by_nobody(path: Path) -> None:
    os.chown(path, NOBODY, -1)


def _bad_owner_root(project) -> Path:
    project.root.mkdir(parents=True)
    _owned_by_nobody(project.root)
    return project.root


def _root_in_nobodys_world_writable_folder(project) -> Path:
    shared = project.root.parent / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # sticky, but not root's: its owner can replace what is in it
    _owned_by_nobody(shared)
    project.root = shared / "target"
    project.configure()
    return shared


def _world_writable_root(project) -> Path:
    project.root.mkdir(parents=True)
    os.chmod(project.root, 0o777)
    return project.root


def _group_writable_agent_folder(project) -> Path:
    (project.root / "agent").mkdir(parents=True)
    os.chmod(project.root / "agent", 0o775)
    return project.root / "agent"


def _symlinked_root(project) -> Path:
    real = project.root.parent / "real-target"
    real.mkdir()
    project.root.symlink_to(real)
    return project.root


CASES = {
    "root owned by another user": (_bad_owner_root, "owner nobody", "belongs to another user"),
    "root inside another user's world-writable folder": (_root_in_nobodys_world_writable_folder, "mode 1777",
                                                         "belongs to another user"),
    "world-writable root": (_world_writable_root, "mode 0777", "writable by other users"),
    "group-writable agent folder": (_group_writable_agent_folder, "mode 0775", "writable by other users"),
    "symlinked root": (_symlinked_root, "owner root", "is a symlink"),
}


def _targets(project) -> list[str]:
    """Every path beside the project folder (the target's side), to prove nothing was made there."""
    base = project.path.parent
    return sorted(str(p) for p in base.rglob("*") if p.relative_to(base).parts[0] != project.path.name)


@pytest.mark.parametrize("case", list(CASES))
def test_a_root_others_could_write_is_refused_before_anything_runs(project, case):
    make, owner_mode, why = CASES[case]
    bad = make(project)
    before = _targets(project)
    for args in (("deploy",), ("status",)):
        res = project.cli(*args)
        assert res.exit_code == 6, res.output
        assert f"refusing to run orch's agent from {bad}" in res.output and owner_mode in res.output, res.output
        assert why in res.output and "hint: " in res.output
    assert _targets(project) == before  # no agent pushed, no folder made
    assert not (project.path / ".orch" / "experiments.db").exists() or project.registry().list() == []


def test_the_default_local_root_is_made_private_and_works(project, monkeypatch, tmp_path):
    """The built-in local target under XDG_DATA_HOME, with a umask that would make folders group-writable."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    text = (project.path / "orch.toml").read_text()
    (project.path / "orch.toml").write_text(text.split("[targets.local]")[0].replace(
        f'[paths]\nroot = "{project.root}"\ncheckpoints = "{project.root}/checkpoints"\n', ""))
    old = os.umask(0o002)
    try:
        res = project.cli("status")
    finally:
        os.umask(old)
    assert res.exit_code == 0, res.output
    agent_dir = tmp_path / "data" / "orch" / "local" / "agent"
    assert oct(os.stat(agent_dir).st_mode & 0o777) == oct(0o755)
    subprocess.run(["tmux", "-L", _socket(agent_dir.parent), "kill-server"], capture_output=True)


def _socket(root: Path) -> str:
    from tests.conftest import tmux_socket

    return tmux_socket(str(root))


def test_a_tampered_agent_file_is_replaced_and_a_tampered_unpacked_copy_refused(tmp_path):
    client = AgentClient(LocalTransport(), str(tmp_path / "root"), sys.executable)
    client.one("hello")
    agent = Path(client.agent_path)
    agent.write_bytes(b"import os; os.system('touch /tmp/planted')")
    fresh = AgentClient(LocalTransport(), str(tmp_path / "root"), sys.executable)
    assert fresh.one("hello")["protocol"] == 1 and agent.read_bytes() == agent_zip()[1]
    unpacked = Path(client.agent_path[:-4] + ".d") / "orchestrator" / "agent" / "run" / "runs.py"
    os.chmod(unpacked, 0o644)
    unpacked.write_text(unpacked.read_text() + "\nPLANTED = True\n")
    with pytest.raises(SafetyError, match="does not match") as info:
        client.one("hello")
    assert "remove" in info.value.hint


def test_the_unpacked_copy_is_checked_against_the_list_its_zip_carries(tmp_path):
    """The bootstrap reads the zip's files and CRCs from the list in it (no zipfile import per call): a file added to
    the unpacked copy is refused as one changed is, and so is a zip without the list, before anything is imported."""
    import io
    import zipfile

    from orchestrator.agent import strict

    client = AgentClient(LocalTransport(), str(tmp_path / "root"), sys.executable)
    client.one("hello")
    unpacked = Path(client.agent_path[:-4] + ".d")
    listed = json.loads((unpacked / strict.FILES).read_text())
    assert set(listed) == set(zipfile.ZipFile(io.BytesIO(agent_zip()[1])).namelist()) - {strict.FILES}
    planted = unpacked / "orchestrator" / "agent" / "run" / "planted.py"
    planted.write_text("import os\n")
    os.chmod(planted, 0o644)
    with pytest.raises(SafetyError, match="planted.py differs"):
        client.one("hello")
    planted.unlink()
    assert client.one("hello")["protocol"] == 1
    unlisted = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(agent_zip()[1])) as whole, zipfile.ZipFile(unlisted, "w") as zf:
        for info in whole.infolist():
            if info.filename != strict.FILES:
                zf.writestr(info, whole.read(info))
    other = tmp_path / "other" / "agent" / "agent-0000000000000000.pyz"
    other.parent.mkdir(parents=True, mode=0o755)
    other.write_bytes(unlisted.getvalue())
    proc = subprocess.run([sys.executable, str(other)], input=json.dumps({"v": 1, "root": str(tmp_path / "other")})
                          .encode(), capture_output=True, timeout=60)
    fatal = unframe(proc.stdout)["fatal"]
    assert proc.returncode == 6 and fatal["kind"] == "safety" and "lists no files" in fatal["message"], proc


def test_the_bootstrap_refuses_a_root_made_writable_after_the_push(tmp_path):
    """What a remote target does: the agent's own bootstrap checks before it imports anything unpacked."""
    root = tmp_path / "root"
    client = AgentClient(LocalTransport(), str(root), sys.executable)
    client.one("hello")
    os.chmod(root, 0o757)
    proc = subprocess.run([sys.executable, client.agent_path], input=json.dumps({"v": 1, "root": str(root)}).encode(),
                          capture_output=True, timeout=60)
    fatal = unframe(proc.stdout)["fatal"]
    assert fatal["kind"] == "safety" and f"from {root}" in fatal["message"] and "mode 0757" in fatal["message"]
    assert proc.returncode == 6 and b"Traceback" not in proc.stderr


def test_the_unpacked_agent_carries_its_bytecode_even_where_python_writes_none(tmp_path, monkeypatch):
    """Many images set PYTHONDONTWRITEBYTECODE: the agent is compiled once as it is unpacked, not on every call,
    and its bytecode names the copy's own path (a traceback points at real files)."""
    import marshal

    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    client = AgentClient(LocalTransport(), str(tmp_path / "root"), sys.executable)
    client.one("hello")
    unpacked = Path(client.agent_path[:-4] + ".d")
    sources = sorted(unpacked.rglob("*.py"))
    assert len(sources) > 20
    for source in sources:
        compiled = source.parent / "__pycache__" / f"{source.stem}.{sys.implementation.cache_tag}.pyc"
        assert compiled.is_file(), compiled
        assert marshal.loads(compiled.read_bytes()[16:]).co_filename == str(source)
        assert oct(compiled.stat().st_mode & 0o777) == oct(0o644)
    assert client.one("hello")["protocol"] == 1  # the strict check of the copy accepts its bytecode
