"""A keeper started as a command begins (``early``) loads what its login needs while it waits to be told the
target: paramiko among it, which the SSH transport itself loads only as it connects, on the login's path."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import io, sys
from pathlib import Path
from orchestrator.reach.keeper import server
keeper = server.Keeper(Path(sys.argv[1]) / "keeper.sock", 60.0, early=True)
assert "paramiko" not in sys.modules
keeper.told(io.BytesIO(b""))  # told nothing: the command that started it never reached a target
print("paramiko" in sys.modules, keeper.stopping.is_set())
"""


def test_an_early_keeper_has_paramiko_loaded_before_it_is_told_the_target(tmp_path):
    out = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]  # loaded, and told nothing it exits as before
