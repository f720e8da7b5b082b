"""The first command of the day, typed as it was before in the same folder: the keeper it starts as it begins is
told at once the connection those words reached the last time (``keeper/memo.py``), and logs in and starts the
agent there while the command still loads; once orch.toml (or the environment) changed, it waits to be told as
before. Seen through the real ``orch`` entry (``orchestrator.main``), a loopback sshd and a target python that
logs each agent process started."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from tests.cli.test_bulk_push import sshd  # noqa: F401  (the fixture)
from tests.cli.test_cold_resident import _close_keepers, _logged_target
from tests.loopback_sshd import SSHD

pytestmark = pytest.mark.skipif(shutil.which("ssh") is None or not SSHD.exists(), reason="needs OpenSSH (ssh, sshd)")

WORDS = ["status", "-t", "box"]
BEGIN = "from orchestrator.reach.keeper import begin; begin.prespawn({words!r}); print('begun')"


def _env() -> dict:
    return dict(os.environ, ORCH_WARM="0")  # each command in a process of its own, as after a break


def _begin(project) -> None:
    """What `orch status -t box` does as it begins, before any of its own imports; then the process ends (as a
    command that fails right after would): whatever the keeper opens now, it was told as the command began."""
    out = subprocess.run([sys.executable, "-c", BEGIN.format(words=WORDS)], cwd=project.path, env=_env(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "begun", out.stderr


def _held(timeout: float) -> list[dict]:
    from orchestrator.reach.keeper import client

    deadline = time.monotonic() + timeout
    while True:
        held = [c for k in client.keepers() for c in k["connections"] if c["alive"] and c["agents"]]
        if held or time.monotonic() > deadline:
            return held
        time.sleep(0.05)


def test_a_first_command_typed_here_before_has_its_keeper_log_in_as_it_begins(project, sshd, tmp_path):  # noqa: F811
    log = _logged_target(project, sshd, tmp_path)
    assert project.run("deploy", "-t", "box").returncode == 0  # the agent is on the target
    _close_keepers()
    res = subprocess.run([sys.executable, "-m", "orchestrator.main", *WORDS], cwd=project.path, env=_env(),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr  # noted where these words went
    _close_keepers()
    log.unlink()

    _begin(project)
    (held,) = _held(30)  # the login and the agent's start, with no word from the command after its start
    assert held["connections"] == 1 and len(held["agents"]) == 1
    assert [line.endswith(".pyz serve") for line in log.read_text().splitlines()] == [True]
    res = subprocess.run([sys.executable, "-m", "orchestrator.main", *WORDS, "--json"], cwd=project.path, env=_env(),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    _close_keepers()

    # orch.toml changed: what the words reach may have too, so the keeper waits to be told (and, told nothing, exits)
    log.unlink()
    (project.path / "orch.toml").write_text((project.path / "orch.toml").read_text() + "\n# changed\n")
    _begin(project)
    assert _held(3) == []
    assert not log.exists()
    _close_keepers()
    assert project.run("stop", "-t", "box").returncode == 0
    _close_keepers()
