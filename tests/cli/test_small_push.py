"""A small push (a one-line change) rides in the launch's locked call: a deploy is then two agent calls (the probe
and the apply), not three; a big one still streams in a call of its own before the lock is taken."""

from __future__ import annotations

import json
import os


def deploy(project) -> dict:
    res = project.run("deploy", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads(res.stdout)


def test_a_one_line_change_is_stored_and_started_in_two_agent_calls(project):
    project.configure(steps=100000, sleep=0.05)
    deploy(project)
    train = project.path / "train.py"
    changed = train.read_text() + "# one line more\n"
    train.write_text(changed)
    out = deploy(project)
    assert out["pushed"]["missing"] == 1 and out["pushed"]["bytes"] == len(changed.encode())
    assert out["stats"]["agent_calls"] == 2, out["stats"]
    assert out["experiment"]["status"] == "running"
    assert (project.run_dir(2) / "work" / "train.py").read_text() == changed  # the run has the new file
    assert project.run("stop").returncode == 0


def test_a_big_change_streams_before_the_lock_in_a_call_of_its_own(project):
    project.configure(steps=100000, sleep=0.05)
    deploy(project)
    (project.path / "big.bin").write_bytes(os.urandom(300 << 10))
    res = project.run("deploy", "--json", "--set", "project.sources=['train.py', 'big.bin']")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["pushed"]["bytes"] == 300 << 10 and out["stats"]["agent_calls"] == 3, out["stats"]
    assert (project.run_dir(2) / "work" / "big.bin").read_bytes() == (project.path / "big.bin").read_bytes()
    assert project.run("stop").returncode == 0
