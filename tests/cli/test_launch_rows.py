"""A deploy's rows in the registry, as the real CLI writes them: the new experiment is made (and synced) before the
target is touched, and what the launch did (the run it stopped, the new run's state) is one transaction after."""

from __future__ import annotations

import json
import os
import subprocess
import sys

TRACED = """
import sqlite3, sys
connect = sqlite3.connect
writes = []
def traced(*args, **kwargs):
    db = connect(*args, **kwargs)
    db.set_trace_callback(lambda sql: writes.append(sql.split()[0].upper()))
    return db
sqlite3.connect = traced
from orchestrator.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print("writes:", " ".join(w for w in writes if w in ("BEGIN", "COMMIT", "INSERT", "UPDATE", "DELETE")))
sys.exit(code)
"""


def traced_deploy(project, *args: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", TRACED, "deploy", *args], cwd=project.path, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, ORCH_WARM="0"))
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()[-1].split()[1:]


def test_a_deploy_that_stops_a_run_records_what_it_did_in_one_transaction(project):
    project.configure(steps=400, sleep=0.1)
    assert project.run("deploy", "-m", "first").returncode == 0
    writes = traced_deploy(project, "-m", "second")
    # the new row, committed before the locked call; then the stopped run and the new run's state together
    assert writes == ["BEGIN", "INSERT", "COMMIT", "BEGIN", "UPDATE", "UPDATE", "COMMIT"], writes
    listed = json.loads(project.run("experiments", "list", "--json").stdout)
    states = {row["id"]: (row["status"], row.get("exit_code")) for row in listed}
    assert states[1][0] == "stopped" and states[2] == ("running", None), states
    assert project.run("stop").returncode == 0
