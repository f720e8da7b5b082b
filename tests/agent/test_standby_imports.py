"""A standby supervisor imports what its run needs before it waits (``runs.import_supervisor``): the start it takes,
and the stop that ends the run, wait for no import. The supervisor imports its modules as it goes (a status call
must not pay for them: ``test_status_imports.py``), so a module added to that path and not to the standby's list would
be imported while a deploy waits; this test runs a supervisor as a standby does and lists what it still imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.agent.layout import Layout, write_json

REPO = Path(__file__).resolve().parents[2]

AS_A_STANDBY = """\
import json, sys
from orchestrator.agent.run import standby
from orchestrator.agent.run.runs import import_supervisor, supervise
import_supervisor()
before = set(sys.modules)
code = supervise(sys.argv[1])
print(json.dumps({"code": code, "imported": sorted(set(sys.modules) - before)}))
"""


def run_folder(root: Path, command: list[str], recovery: dict | None = None) -> str:
    layout = Layout(str(root))
    layout.ensure()
    run_dir = layout.run_dir(3, "0123456789ab")
    os.makedirs(run_dir)
    write_json(os.path.join(run_dir, "experiment.json"), {"id": 3, "project": "p"})
    write_json(os.path.join(run_dir, "launch.json"), {"argv": command, "cwd": str(root), "env": {},
                                                     "created": time.time(), "recovery": recovery or {}})
    return run_dir


def supervised(run_dir: str) -> dict:
    out = subprocess.run([sys.executable, "-c", AS_A_STANDBY, run_dir], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_a_standby_imports_nothing_from_taking_a_run_to_its_exit_record(tmp_path):
    run_dir = run_folder(tmp_path / "root", [sys.executable, "-c", "print('step=1 loss=2.0')"])
    got = supervised(run_dir)
    assert got["code"] == 0
    assert json.loads(Path(run_dir, "exit.json").read_text())["exit_code"] == 0
    assert "step=1 loss=2.0" in Path(run_dir, "train.log").read_text()
    assert got["imported"] == []


def test_nor_for_a_run_that_crashes_and_is_restarted(tmp_path):
    """The restart policy's path: a crash, the backoff, the second attempt (its checkpoint looked for)."""
    run_dir = run_folder(tmp_path / "root", [sys.executable, "-c", "import sys; sys.exit(3)"],
                         recovery={"restarts": 1, "backoff": [0.01]})
    got = supervised(run_dir)
    assert got["code"] == 3
    assert len(json.loads(Path(run_dir, "attempts.json").read_text())["attempts"]) == 2
    assert got["imported"] == []
