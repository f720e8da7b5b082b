"""``orch connections close`` on a shared account: the socket folder is per uid, so keepers and warm processes of
other homes (or other orch installations) live beside the caller's; ``close`` ends only the caller's own, says
what it left, and ``--all`` ends them too. Real keepers and a real warm process, each started as orch starts it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from orchestrator import sockets
from orchestrator.reach.keeper import client
from orchestrator.warm import client as warm_client
from tests.conftest import wait_for

REPO = Path(__file__).resolve().parents[2]


def start(module: str, name: str, home: Path) -> subprocess.Popen:
    """A server as ``sockets.spawn`` starts it, with ``HOME`` set to ``home``."""
    home.mkdir(exist_ok=True)
    path = sockets.folder() / f"{name}{sockets.SUFFIX}"
    proc = subprocess.Popen([sys.executable, "-m", module, str(path), "120"], cwd=REPO, start_new_session=True,
                            env={**os.environ, "HOME": str(home)}, stdout=subprocess.DEVNULL)
    Path(f"{path.with_suffix('')}.spawned").write_text(str(proc.pid))  # what spawn() records
    wait_for(lambda: sockets.connect(path) is not None and os.path.exists(f"{path.with_suffix('')}.owner"),
             timeout=60, what=f"{name} to listen")
    return proc


def orch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60)


def test_close_ends_only_the_callers_own_and_all_ends_every_one(tmp_path):
    own = start("orchestrator.reach.keeper", "keeper-aaaaaaaaaaaa", Path(os.path.expanduser("~")))
    other = start("orchestrator.reach.keeper", "keeper-bbbbbbbbbbbb", tmp_path / "bob")
    warm = start("orchestrator.warm.server", "warm-cccccccccccc", tmp_path / "bob")
    try:
        assert sorted(k["mine"] for k in client.keepers()) == [False, True]
        res = orch("connections", "close")
        assert res.returncode == 0, res.stderr
        assert "closed 0 connection(s); 1 keeper(s) exited" in res.stdout
        assert "1 other keeper and 1 other warm process of this user, for other homes or orch installations, " \
               "left running; --all ends them" in res.stdout
        own.wait(timeout=20)
        time.sleep(0.5)
        assert other.poll() is None and warm.poll() is None
        assert [k["pid"] for k in client.keepers()] == [other.pid]
        assert [w["pid"] for w in warm_client.processes()] == [warm.pid]

        res = orch("connections", "close", "--all")
        assert res.returncode == 0, res.stderr
        assert "left running" not in res.stdout
        assert "1 warm orch process(es) exited" in res.stdout
        other.wait(timeout=20)
        warm.wait(timeout=20)
        assert client.keepers() == [] and warm_client.processes() == []
        res = orch("connections", "close")  # nothing left: it says so, and claims no keeper exited
        assert (res.returncode, res.stdout) == (0, "no connection keeper was running: nothing to close\n"), res
    finally:
        for proc in (own, other, warm):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
