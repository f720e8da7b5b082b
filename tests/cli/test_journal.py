"""A launch whose orch is SIGKILLed after the target did everything: the next command learns it all from the
target's journal (real CLI in a subprocess, real tmux, a real SIGKILL at the exact moment)."""

from __future__ import annotations

import json
import signal
import stat
import sys
from pathlib import Path

from tests.cli.test_way_back import _failing_tmux, _names, _running_with_checkpoints, _trash_entries

# The target's python: the real agent, then, once the locked apply (the call that starts the run) has answered,
# a SIGKILL to orch before it can read the answer: nothing of what the target did reaches the registry.
KILLER = """#!{python}
import json, os, signal, subprocess, sys
data = sys.stdin.buffer.read()
request = json.loads(data.split(b"\\n", 1)[0] or b"{{}}")
proc = subprocess.run([{python!r}, *sys.argv[1:]], input=data, stdout=subprocess.PIPE)
if request.get("lock") is not None and any(o.get("op") == "run_start" for o in request.get("ops", [])):
    os.kill(os.getppid(), signal.SIGKILL)
sys.stdout.buffer.write(proc.stdout)
sys.exit(proc.returncode)
"""


def _killing_python(project, tmp_path: Path) -> None:
    wrapper = tmp_path / "python-killer"
    wrapper.write_text(KILLER.format(python=sys.executable))
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    project.configure(steps=100000, ckpt_every=5, sleep=0.05, extra=f'python = "{wrapper}"\n')


def _journal(project, exp_id: int) -> list[dict]:
    return [json.loads(line) for line in (project.run_dir(exp_id) / "journal.jsonl").read_text().splitlines()]


def test_a_launch_killed_after_the_target_did_everything_is_recorded_from_the_journal(project, tmp_path):
    before = _running_with_checkpoints(project)
    _killing_python(project, tmp_path)
    res = project.run("restart", "--clean-checkpoints", "--yes")
    assert res.returncode == -signal.SIGKILL, res.stdout + res.stderr
    with project.registry() as reg:
        assert reg.get(2).status == "launching" and reg.get(2).checkpoints_action is None
        assert reg.get(1).status == "running"  # what the registry believed when orch died
    [entry] = _trash_entries(project)
    assert before <= {p.name for p in entry.iterdir()}
    steps = [(e["event"], e.get("op")) for e in _journal(project, 2)]
    assert ("done", "run_stop") in steps and ("done", "ckpt_trash") in steps and steps[-1] == ("end", None)
    project.configure(steps=100000, ckpt_every=5, sleep=0.05)  # the real python again
    res = project.run("status", "--json")
    assert res.returncode == 0, res.stderr
    with project.registry() as reg:
        old, new = reg.get(1), reg.get(2)
    assert new.status == "running"
    assert new.checkpoints_action == "moved" and new.checkpoints_entry == str(entry)
    assert old.status == "stopped" and old.end_reason == "stopped by experiment 2"
    assert old.exit_code is not None and old.ended is not None


def test_a_launch_killed_after_a_failed_start_says_where_the_checkpoints_are(project, tmp_path):
    before = _running_with_checkpoints(project)
    _killing_python(project, tmp_path)
    env = _failing_tmux(tmp_path)
    res = project.run("restart", "--clean-checkpoints", "--yes", env=env)
    assert res.returncode == -signal.SIGKILL, res.stdout + res.stderr
    [entry] = _trash_entries(project)  # orch died before it could put them back
    project.configure(steps=100000, ckpt_every=5, sleep=0.05)
    res = project.run("status", "--json", env=env)
    assert res.returncode == 0, res.stderr
    with project.registry() as reg:
        old, new = reg.get(1), reg.get(2)
    assert new.status == "failed"
    assert new.checkpoints_action == "moved" and new.checkpoints_entry == str(entry)
    assert f"checkpoints were moved to {entry} (orch checkpoints restore {entry.name})" in new.end_reason
    assert old.status == "stopped" and old.end_reason == "stopped by experiment 2 (whose start then failed)"
    res = project.run("checkpoints", "restore", entry.name)
    assert res.returncode == 0, res.stderr
    assert before <= _names(project)
