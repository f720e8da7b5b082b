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


def test_a_command_starts_its_keeper_before_it_loads_any_transport():
    """``main.py`` starts the keeper with ``begin.prespawn`` before the CLI's imports: what that loads is the least
    it needs, so the keeper's own start begins the sooner (no transport, no dataclasses, no inspect)."""
    probe = ("import sys, orchestrator.main\nfrom orchestrator.reach.keeper import begin\n"
             "print(sorted(m for m in ('orchestrator.reach.transport', 'orchestrator.reach.keeper.client', "
             "'dataclasses', 'inspect', 'socket') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
