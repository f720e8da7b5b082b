"""Runs that recover: the on-target supervisor restarts a failed or stalled run by itself (real CLI, tmux, SQLite)."""

from __future__ import annotations

import json
import time

from tests.cli.test_lifecycle import wait_status

# crashes on its first two attempts, succeeds on the third; records what orch handed each attempt
FLAKY = """\
import json, os, pathlib, sys
ck = pathlib.Path(os.environ["ORCH_CHECKPOINT_DIR"])
counter = ck / ".count"
n = int(counter.read_text()) if counter.exists() else 0
counter.write_text(str(n + 1))
seen = {k: os.environ.get(k) for k in ("ORCH_ATTEMPT", "ORCH_RESUME", "ORCH_RESUME_FROM")}
with open(ck / ".seen.jsonl", "a") as fh:
    fh.write(json.dumps(seen) + "\\n")
(ck / f"ckpt-{n}.pt").write_text(str(n))
print(f"step={n + 1} loss=1.0", flush=True)
sys.exit(0 if n >= {ok_at} else 1)
"""

STALLS = """\
import os, pathlib, sys, time
ck = pathlib.Path(os.environ["ORCH_CHECKPOINT_DIR"])
n = len(list(ck.glob("ckpt-*")))
(ck / f"ckpt-{n}.pt").write_text(str(n))
print(f"step={n + 1} loss=1.0", flush=True)
if n == 0:
    time.sleep(3600)  # alive, silent: a hang
"""


def _deploy(project, script: str, *sets: str):
    (project.path / "job.py").write_text(script)
    args = ["--set", "project.sources=['job.py']", "--set", "project.command=python3 job.py"]
    for s in sets:
        args += ["--set", s]
    res = project.cli("deploy", "--json", *args)
    assert res.exit_code in (0, 1), res.output
    return res


def _show(project, exp_id: int = 1) -> dict:
    res = project.cli("experiments", "show", str(exp_id), "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_crashes_twice_then_finishes_resuming_from_the_newest_checkpoint(project):
    _deploy(project, FLAKY.replace("{ok_at}", "2"), "run.restarts=3", "run.backoff=[0.2]")
    final = wait_status(project, 1, ("finished",))
    assert final["exit_code"] == 0
    ck = project.checkpoints
    seen = [json.loads(line) for line in (ck / ".seen.jsonl").read_text().splitlines()]
    assert [s["ORCH_ATTEMPT"] for s in seen] == ["0", "1", "2"]
    assert [s["ORCH_RESUME"] for s in seen] == [None, "1", "1"]
    assert [s["ORCH_RESUME_FROM"] for s in seen] == ["", str(ck / "ckpt-0.pt"), str(ck / "ckpt-1.pt")]
    tried = _show(project)["attempts"]
    assert [a["exit_code"] for a in tried] == [1, 1, 0]
    assert [a["reason"] for a in tried] == ["exit code 1", "exit code 1", "exit code 0"]
    assert [a["resumed_from"] for a in tried] == [None, str(ck / "ckpt-0.pt"), str(ck / "ckpt-1.pt")]
    assert all(a["ended"] >= a["started"] for a in tried)
    gaps = [b["started"] - a["ended"] for a, b in zip(tried, tried[1:])]
    print(f"crash -> next attempt started: {', '.join(f'{g:.2f}' for g in gaps)} s (backoff 0.2 s)")
    assert all(0.2 <= g <= 2.2 for g in gaps)
    log = (project.run_dir(1) / "train.log").read_text()
    assert f"[orch] attempt 2 of 4 after exit code 1; resuming from {ck / 'ckpt-0.pt'}" in log
    assert f"[orch] attempt 3 of 4 after exit code 1; resuming from {ck / 'ckpt-1.pt'}" in log
    on_target = json.loads((project.run_dir(1) / "attempts.json").read_text())
    assert on_target["max"] == 4 and len(on_target["attempts"]) == 3
    text = project.cli("experiments", "show", "1").output
    assert "attempts:" in text and "resumed from" in text


def test_restarts_exhausted_is_crashed_with_every_attempt(project):
    _deploy(project, FLAKY.replace("{ok_at}", "99"), "run.restarts=1", "run.backoff=[0.2]")
    final = wait_status(project, 1, ("crashed",))
    assert final["exit_code"] == 1
    tried = _show(project)["attempts"]
    assert [a["exit_code"] for a in tried] == [1, 1]
    assert len((project.checkpoints / ".seen.jsonl").read_text().splitlines()) == 2
    text = project.cli("status").output
    assert "attempt 2/2" in text and "last failure: exit code 1" in text


def test_stop_during_backoff_is_final(project):
    _deploy(project, FLAKY.replace("{ok_at}", "99"), "run.restarts=3", "run.backoff=[30]")
    run_dir = project.run_dir(1)
    deadline = time.monotonic() + 30
    while not (json.loads((run_dir / "attempts.json").read_text() or "{}") if (run_dir / "attempts.json").exists()
               else {}).get("waiting_until"):
        assert time.monotonic() < deadline, "the run never entered its backoff"
        time.sleep(0.1)
    assert "restarting" in project.cli("status").output
    began = time.monotonic()
    res = project.cli("stop")
    assert res.exit_code == 0, res.output
    assert time.monotonic() - began < 10  # not the 30 s of backoff
    final = wait_status(project, 1, ("stopped",))
    assert final["state"] == "stopped"
    time.sleep(0.5)
    assert len((project.checkpoints / ".seen.jsonl").read_text().splitlines()) == 1
    tried = _show(project)["attempts"]
    assert len(tried) == 1 and tried[0]["reason"] == "exit code 1"


def test_a_stalled_run_is_ended_and_restarted(project):
    _deploy(project, STALLS, "run.restarts=2", "run.backoff=[0.2]", "run.stall_after=2", "run.term_timeout=1")
    wait_status(project, 1, ("finished",), timeout=60)
    tried = _show(project)["attempts"]
    assert [a["reason"] for a in tried] == ["stalled", "exit code 0"]
    assert tried[0]["exit_code"] == 143  # SIGTERM
    assert tried[1]["resumed_from"] == str(project.checkpoints / "ckpt-0.pt")
    log = (project.run_dir(1) / "train.log").read_text()
    assert "stopped as stalled" in log and "[orch] attempt 2 of 3 after stalled" in log


def test_the_example_crashes_then_resumes_from_its_checkpoint_and_finishes(project):
    """tinylm end to end: a crash at step 25, a restart from ckpt 20, the steps go on from there to the end."""
    project.configure(steps=40, ckpt_every=10)
    toml = project.path / "orch.toml"
    toml.write_text(toml.read_text().replace('TINYLM_SAMPLES = "600"', 'TINYLM_SAMPLES = "600", '
                                             'TINYLM_CRASH_AT_STEP = "25", TINYLM_LOG_EVERY = "5"'))
    res = project.cli("deploy", "--set", "run.restarts=2", "--set", "run.backoff=[0.2]")
    assert res.exit_code == 0, res.output
    final = wait_status(project, 1, ("finished", "crashed"))
    log = (project.run_dir(1) / "train.log").read_text()
    assert final["state"] == "finished", log[-3000:]
    assert "simulated crash" in log or "exit code 3" in log
    assert "resumed from step=20 checkpoint=ckpt-000020.npz" in log
    after = log.split("resumed from step=20")[1]
    steps = [int(line.split("step=")[1].split()[0]) for line in after.splitlines() if line.startswith("step=")]
    assert steps[0] == 25 and steps[-1] == 40  # the sequence goes on from the checkpoint
    assert [a["exit_code"] for a in project.registry().get(1).attempts] == [3, 0]
