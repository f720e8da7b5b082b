"""The target's side of a failed guard, on real files and processes: a run whose guard failed is never resumed at
boot (its rollback puts the parent back instead), and a rollback cut short is started again by the next status."""

from __future__ import annotations

import json
import os
import time

from orchestrator.agent.run import rollback, runs
from orchestrator.agent.watch import guard
from orchestrator.agent.layout import Layout, write_json


def lost_run(root, guard_state: str) -> str:
    layout = Layout(str(root))
    layout.ensure()
    run_dir = layout.run_dir(2, "0123456789ab")
    os.makedirs(run_dir)
    write_json(os.path.join(run_dir, "experiment.json"), {"id": 2, "project": "p"})
    write_json(os.path.join(run_dir, "launch.json"), {"argv": ["true"], "cwd": run_dir, "env": {}, "created": 0,
                                                     "recovery": {}})
    write_json(os.path.join(run_dir, "pid.json"), {"supervisor": 999999, "child": 999998, "started": time.time()})
    write_json(os.path.join(run_dir, "guard.json"), {"state": guard_state, "reason": "crashed at step 5 (exit code 3)",
                                                    "on_fail": "rollback"})
    return run_dir


def test_a_run_whose_guard_failed_is_not_resumed_after_a_reboot(tmp_path, capsys):
    run_dir = lost_run(tmp_path / "root", "failed")
    assert runs.run_state(run_dir)["state"] == "lost"
    assert runs.resume(run_dir) == 0
    said = capsys.readouterr().out
    assert "not resuming" in said and "its guard failed" in said, said
    assert not os.path.exists(os.path.join(run_dir, "attempts.json"))  # no new attempt was started


def test_a_rollback_whose_process_is_gone_is_started_again_once(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(guard, "spawn_rollback", lambda run_dir, agent: started.append(run_dir))
    run_dir = lost_run(tmp_path / "root", "failed")
    layout = Layout(str(tmp_path / "root"))
    rollback.resume_pending(layout)
    assert started == [run_dir]
    write_json(os.path.join(run_dir, rollback.PID), {"pid": os.getpid(), "start": runs._proc_start(os.getpid())})
    rollback.resume_pending(layout)  # its process is alive: left to it
    assert started == [run_dir]
    write_json(os.path.join(run_dir, "guard.json"), {"state": "rolled back", "on_fail": "rollback"})
    os.unlink(os.path.join(run_dir, rollback.PID))
    rollback.resume_pending(layout)  # done: nothing to do
    assert started == [run_dir] and json.loads(open(os.path.join(run_dir, "guard.json")).read())["state"] == \
        "rolled back"


def test_at_boot_a_run_lost_inside_its_guard_window_fails_its_guard_and_is_rolled_back_not_resumed(tmp_path,
                                                                                                  monkeypatch):
    started = []
    monkeypatch.setattr(guard, "spawn_rollback", lambda run_dir, agent: started.append(run_dir))
    run_dir = lost_run(tmp_path / "root", "watching")
    with open(os.path.join(run_dir, "train.log"), "w") as fh:
        fh.write("step=13 loss=2.1 tok_s=500\nstep=14 loss=2.0 tok_s=500\n")
    assert rollback.at_boot(run_dir) == 0
    state = json.loads(open(os.path.join(run_dir, "guard.json")).read())
    assert state["state"] == "failed" and state["reason"] == "lost at step 14 (its supervisor was killed)", state
    assert "step" not in state  # no stale progress of the window
    assert started == [run_dir]
    assert not os.path.exists(os.path.join(run_dir, "attempts.json"))  # no new attempt was started
    events = [json.loads(line) for line in open(os.path.join(run_dir, "guard.jsonl"))]
    assert [e["event"] for e in events] == ["failed"] and events[0]["reason"] == state["reason"]
    rollback.at_boot(run_dir)  # a second look (the next status) decides nothing again
    assert len(open(os.path.join(run_dir, "guard.jsonl")).readlines()) == 1
