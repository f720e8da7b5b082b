"""``orch deploy --queue``, ``orch queue``, ``orch stop [--all]`` on the local target: real tmux, the real CLI in a
subprocess, the target's files. A queued experiment starts when the one before it ends, with no orch command in
between: the tests wait on the run folders, never through orch."""

from __future__ import annotations

import json
import time

from tests.conftest import snapshot, tmux_socket, wait_for


def _started(project, exp_id: int) -> float:
    return json.loads((project.run_dir(exp_id) / "pid.json").read_text())["started"]


def _ended(project, exp_id: int) -> float:
    return json.loads((project.run_dir(exp_id) / "exit.json").read_text())["ended"]


def _deploy(project, *args: str) -> str:
    done = project.run("deploy", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_two_queued_experiments_start_in_order_when_the_one_before_ends(project):
    project.configure(steps=200, sleep=0.03, ckpt_every=100)
    _deploy(project, "-m", "first")
    said = _deploy(project, "--queue", "-m", "second")
    assert "experiment 2: queued on local at position 1 behind experiment 1" in said
    said = _deploy(project, "--queue", "-m", "third")
    assert "experiment 3: queued on local at position 2 behind experiment 1" in said
    with project.registry() as reg:
        assert [reg.get(i).status for i in (2, 3)] == ["queued", "queued"]
    assert not project.run_dir(3).exists()  # its folder is made when it starts
    listed = json.loads(project.run("queue", "--json").stdout)
    assert [(e["id"], e["position"], e["message"]) for e in listed["queue"]] == [(2, 1, "second"), (3, 2, "third")]
    # no orch command from here: the target's supervisor starts each one when the one before it ends
    wait_for(lambda: (project.run_dir(3) / "exit.json").exists(), timeout=90, what="the third run's end")
    assert _ended(project, 1) <= _started(project, 2) <= _ended(project, 2) <= _started(project, 3)
    assert _started(project, 3) - _ended(project, 2) < 5
    assert not list((project.root / "queue" / "tinylm").glob("*.json"))
    assert "step=200" in (project.run_dir(3) / "train.log").read_text()
    assert project.run("status").returncode == 0  # the first command since: it records what the target did
    listed = project.run("experiments", "list", "--json")
    assert [(e["id"], e["status"]) for e in json.loads(listed.stdout)] == \
        [(3, "finished"), (2, "finished"), (1, "finished")]


# the first run kills its own tmux session once told to (the file TOLD appears): its supervisor's terminal is gone as
# the run ends, as when orch stop's kill-session comes the moment the run's exit is recorded
HANGS_UP = """\
import os, subprocess, time
print("step=1 loss=1.0", flush=True)
if os.environ["ORCH_EXPERIMENT_ID"] == "1":
    while not os.path.exists(TOLD):
        time.sleep(0.05)
    subprocess.run(["tmux", "-L", SOCKET, "kill-session", "-t", "=orch-tinylm"])
    time.sleep(60)  # the session's hang-up, passed on by the supervisor, ends it
"""


def test_the_next_queued_experiment_starts_when_the_runs_terminal_is_gone_as_it_ends(project, tmp_path):
    told = tmp_path / "told"
    (project.path / "train.py").write_text(f"TOLD = {str(told)!r}\nSOCKET = {tmux_socket(str(project.root))!r}\n"
                                           + HANGS_UP)
    project.configure()
    _deploy(project, "-m", "first")
    said = _deploy(project, "--queue", "-m", "second")
    assert "experiment 2: queued on local at position 1 behind experiment 1" in said
    told.touch()
    wait_for(lambda: (project.run_dir(2) / "exit.json").exists(), timeout=90, what="the queued run's end")
    assert json.loads((project.run_dir(1) / "exit.json").read_text())["signal"] == 1  # SIGHUP: its session went
    assert json.loads((project.run_dir(2) / "exit.json").read_text())["exit_code"] == 0
    assert "step=1 loss=1.0" in (project.run_dir(2) / "train.log").read_text()
    assert not list((project.root / "queue" / "tinylm").glob("*.json"))


def test_queue_remove_and_stop_leave_or_empty_the_queue(project):
    project.configure(steps=100000, sleep=0.05)
    _deploy(project)
    _deploy(project, "--queue", "-m", "two")
    _deploy(project, "--queue", "-m", "three")
    _deploy(project, "--queue", "-m", "four")
    removed = project.run("queue", "remove", "2")
    assert removed.returncode == 0, removed.stderr
    assert "experiment 2: removed from the queue on local" in removed.stdout
    status = project.run("status")
    assert "queued 1: experiment 3" in status.stdout and "queued 2: experiment 4" in status.stdout, status.stdout
    shown = project.run("queue")
    assert "experiment 3 has not started: experiment 1 is running" in shown.stdout, shown.stdout
    with project.registry() as reg:
        gone = reg.get(2)
    assert (gone.status, gone.end_reason) == ("stopped", "removed from the queue before it started")
    # a plain stop stops the running one: the next queued one starts, the rest stays queued
    stopped = project.run("stop")
    assert stopped.returncode == 0, stopped.stderr
    wait_for(lambda: (project.run_dir(3) / "pid.json").exists(), timeout=30, what="experiment 3's start")
    assert not project.run_dir(2).exists()
    listed = json.loads(project.run("queue", "--json").stdout)["queue"]
    assert [e["id"] for e in listed] == [4]
    # --all empties the queue first: nothing starts after the stop
    stopped = project.run("stop", "--all")
    assert stopped.returncode == 0, stopped.stderr
    assert "removed from the queue on local: experiment 4" in stopped.stdout
    assert "experiment 3 on local: stopped" in stopped.stdout, stopped.stdout
    time.sleep(2)  # a queue left behind starts its next run within a second of the stop
    assert not project.run_dir(4).exists()
    assert "nothing is queued on local" in project.run("queue").stdout
    with project.registry() as reg:
        assert [reg.get(i).status for i in (1, 2, 3, 4)] == ["stopped", "stopped", "stopped", "stopped"]


def test_bad_queue_input_says_what_to_do_and_changes_nothing(project):
    project.configure(steps=100000, sleep=0.05)
    _deploy(project)
    before = snapshot(project.root / "queue", project.path / ".orch")
    for args, message in ((["deploy", "--queue", "--clean-checkpoints", "--yes"], "--queue cannot clean the checkpoints"),
                          (["queue", "remove", "1"], "experiment 1 is not queued (it is running)"),
                          (["queue", "remove", "99"], "no experiment 99")):
        done = project.run(*args)
        assert done.returncode != 0, args
        assert f"error: {message}" in done.stderr and "hint: " in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr
    assert snapshot(project.root / "queue", project.path / ".orch").keys() == before.keys()
    with project.registry() as reg:
        assert len(reg.list()) == 1
