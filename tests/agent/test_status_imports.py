"""What an agent call that only reads imports. Each agent call on the local target is a new Python, so every module
a status loads (and the log read orch status asks in the same call) is paid again at each one: the supervisor's
modules, and the standard library they need (subprocess, dataclasses with inspect and ast), load only where a run
is started, supervised or stopped."""

from __future__ import annotations

import json
import subprocess
import sys

from orchestrator.agent.layout import write_json

CALL = """\
import json, sys
from orchestrator.agent.__main__ import OPS
from orchestrator.agent.layout import Layout
layout = Layout(sys.argv[1])
status = OPS["status"][0](layout, gpus=False, project="p", last=20)
read = OPS["log_read"][0](layout, exp_id=1, offset=0, max_bytes=1024)
print(json.dumps({"states": [r["state"] for r in status["runs"]], "read": read["data"] if "data" in read else None,
                  "modules": sorted(sys.modules)}))
"""
LAUNCH = "what starts, supervises and stops a run"
NOT_READ = {"subprocess": LAUNCH, "dataclasses": LAUNCH, "inspect": LAUNCH, "ast": LAUNCH, "hashlib": LAUNCH,
            "tempfile": LAUNCH, "orchestrator.agent.run.attempts": LAUNCH, "orchestrator.agent.run.heartbeat": LAUNCH,
            "orchestrator.agent.run.watchdog": LAUNCH, "orchestrator.agent.run.tmux": LAUNCH,
            "orchestrator.agent.run.standby": LAUNCH, "orchestrator.agent.run.causes": LAUNCH,
            "orchestrator.agent.watch.guard": LAUNCH, "orchestrator.agent.ckpt.checkpoints": LAUNCH}


def test_a_status_and_log_read_of_an_ended_run_import_none_of_the_launch_side(tmp_path):
    run = tmp_path / "runs" / "1"
    run.mkdir(parents=True)
    write_json(str(run / "experiment.json"), {"id": 1, "project": "p"})
    write_json(str(run / "pid.json"), {"supervisor": 0, "started": 1.0})
    write_json(str(run / "exit.json"), {"exit_code": 0, "signal": None, "ended": 2.0})
    write_json(str(run / "attempts.json"), {"max": 2, "attempts": [{"attempt": 0, "reason": "exit code 0"}]})
    write_json(str(run / "guard.json"), {"state": "passed"})
    (run / "train.log").write_text("step=1 loss=2.0\n")
    out = subprocess.run([sys.executable, "-c", CALL, str(tmp_path)], capture_output=True, text=True, check=True,
                         timeout=60)
    got = json.loads(out.stdout)
    assert got["states"] == ["finished"]
    assert got["read"]  # the log was read
    loaded = set(got["modules"])
    assert sorted(f"{m} ({why})" for m, why in NOT_READ.items() if m in loaded) == []
