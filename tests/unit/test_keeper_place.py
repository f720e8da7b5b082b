"""Where keepers listen: a private folder per user, a socket per home and orch version, refused when unsafe.
Another user is a real one (uid 65534 through setpriv)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from orchestrator import sockets
from orchestrator.errors import SafetyError
from orchestrator.reach.keeper import client, place

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534


def as_nobody(code: str, env: dict) -> subprocess.CompletedProcess:
    """``code`` run by uid 65534 with the system python and a copy of the package it can read."""
    if shutil.which("setpriv") is None:
        pytest.fail("setpriv (util-linux) is needed to run as another user")
    copy = tempfile.mkdtemp(prefix="orch-pkg-")
    try:
        shutil.copytree(REPO / "orchestrator", Path(copy) / "orchestrator",
                        ignore=shutil.ignore_patterns("__pycache__"))
        for path, dirs, files in os.walk(copy):
            os.chmod(path, 0o755)
            for name in files:
                os.chmod(os.path.join(path, name), 0o644)
        argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "env", "-i",
                *[f"{k}={v}" for k, v in env.items()], f"PYTHONPATH={copy}", "python3", "-c", code]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60)
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def test_two_users_get_folders_of_their_own_and_cannot_reach_each_other(monkeypatch, tmp_path):
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    mine = place.socket_path()
    assert mine.parent == Path(f"/tmp/orch-{os.getuid()}")
    keeper = subprocess.Popen([sys.executable, "-m", "orchestrator.reach.keeper", str(mine), "30"], cwd=REPO,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while sockets.connect(mine) is None:
            assert time.monotonic() < deadline and keeper.poll() is None, "the keeper did not listen"
            time.sleep(0.05)
        code = ("import json, socket; from orchestrator.reach.keeper import place\n"
                "p = place.socket_path(); s = socket.socket(socket.AF_UNIX)\n"
                f"try:\n    s.connect({str(mine)!r}); reach = 'connected'\n"
                "except OSError as e:\n    reach = type(e).__name__\n"
                "print(json.dumps({'path': str(p), 'reach': reach}))")
        res = as_nobody(code, {"HOME": "/nonexistent", "PATH": "/usr/bin:/bin"})
        assert res.returncode == 0, res.stderr
        theirs = json.loads(res.stdout)
        assert Path(theirs["path"]).parent == Path(f"/tmp/orch-{NOBODY}")
        assert theirs["reach"] == "PermissionError"  # root's folder is 0700 and its socket 0600
        info = os.stat(f"/tmp/orch-{NOBODY}")
        assert info.st_uid == NOBODY and info.st_mode & 0o777 == 0o700
        assert os.stat(mine).st_mode & 0o777 == 0o600
    finally:
        client.close(None)
        keeper.wait(timeout=20)
    assert not mine.exists()  # the keeper removes its socket as it exits


def test_a_folder_another_user_owns_or_others_can_read_is_refused(monkeypatch, tmp_path):
    runtime = Path(tempfile.mkdtemp(prefix="orch-rt-"))
    try:
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
        (runtime / "orch").mkdir(mode=0o700)
        os.chown(runtime / "orch", NOBODY, NOBODY)
        with pytest.raises(SafetyError, match="not a private folder of this user") as info:
            place.socket_path()
        assert "persist = 0" in info.value.hint
        os.chown(runtime / "orch", os.getuid(), os.getgid())
        os.chmod(runtime / "orch", 0o755)
        with pytest.raises(SafetyError, match="mode 755"):
            sockets.folder()
        os.chmod(runtime / "orch", 0o700)
        assert sockets.folder() == runtime / "orch"
    finally:
        shutil.rmtree(runtime)


def test_the_socket_name_follows_the_home_folder(monkeypatch):
    first = place.socket_path()
    monkeypatch.setenv("HOME", "/some/other/home")
    second = place.socket_path()
    assert first.parent == second.parent and first != second


def test_a_runtime_folder_too_long_for_a_socket_path_falls_back_to_tmp(monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/" + "x" * 90)
    assert sockets.folder() == Path(f"/tmp/orch-{os.getuid()}")
    assert len(str(place.socket_path())) < 100
