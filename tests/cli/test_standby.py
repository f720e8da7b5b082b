"""The standby supervisor on the local target, through the real CLI: after a start the agent leaves the next run's
supervisor waiting (imported) in tmux; the next deploy hands its run to it instead of having tmux start Python.

The run's supervisor must still be its tmux pane's process (attach, stop and the exit record as before), in the
project's session and the experiment's window; secrets still come only through the pipe; a standby of another
agent is never used.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import subprocess
import time
from pathlib import Path

from tests.cli.test_lifecycle import wait_status
from tests.cli.test_secrets import configure as configure_secrets
from tests.cli.test_secrets import write_secrets_file
from tests.conftest import tmux_socket
from tests.waits import wait_for

SESSION = "orch-tinylm"
STANDBY = "orch~standby"


def tmux(project, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["tmux", "-L", tmux_socket(str(project.root)), *args], capture_output=True, text=True)


def pane(project, session: str) -> tuple[int, str] | None:
    res = tmux(project, "display-message", "-p", "-t", f"={session}:", "#{pane_pid} #{window_name}")
    if res.returncode != 0 or tmux(project, "has-session", "-t", f"={session}").returncode != 0:
        return None
    pid, name = res.stdout.split()
    return int(pid), name


def cmdline(pid: int) -> list[str]:
    return [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]


def record(project) -> dict | None:
    path = project.root / "standby" / "standby.json"
    return json.loads(path.read_text()) if path.exists() else None


def standby_ready(project, timeout: float = 30.0, not_pid: int | None = None) -> dict:
    """The waiting standby's record once it is up (``not_pid``: once one other than that pid is)."""
    deadline = time.monotonic() + timeout
    while True:
        found = record(project)
        if found is not None and found.get("pid") != not_pid and pane(project, STANDBY) is not None:
            return found
        assert time.monotonic() < deadline, "no standby came up"
        time.sleep(0.05)


def supervisor(project, exp_id: int) -> int:
    pid = json.loads((project.run_dir(exp_id) / "pid.json").read_text())
    return int(pid["supervisor"])


def test_the_next_start_is_supervised_by_the_standby_as_its_panes_process(project):
    project.configure(steps=100000, sleep=0.05)
    assert project.run("deploy").returncode == 0
    waiting = standby_ready(project)
    assert cmdline(waiting["pid"])[-2:] == ["standby", str(project.root)]
    assert oct((project.root / "standby").stat().st_mode & 0o777) == "0o700"
    res = project.run("deploy")
    assert res.returncode == 0, res.stderr
    assert "started on local" in res.stdout
    took = supervisor(project, 2)
    assert took == waiting["pid"]  # the standby became run 2's supervisor ...
    assert pane(project, SESSION) == (took, "exp2")  # ... still its pane's process, in the project's session
    assert cmdline(took)[-2] == "standby"
    again = standby_ready(project)  # and a new one waits for the next start
    assert again["pid"] != took
    assert project.run("stop").returncode == 0
    state = wait_status(project, 2, ("stopped",))
    assert state["exit_code"] is not None  # the standby-made supervisor recorded the exit
    assert pane(project, SESSION) is None  # the session went with the run, as before
    log = (project.run_dir(2) / "train.log").read_text()
    assert "step=" in log and "stopped by signal 2" in log  # the command ran under it and got the SIGINT


def test_a_crash_of_a_run_the_standby_took_is_recorded(project):
    project.configure(steps=100000, sleep=0.05)
    assert project.run("deploy").returncode == 0
    standby_ready(project)
    res = project.run("deploy", "--set", "project.command=sh -c 'sleep 0.3; exit 6'", "--wait=20")
    assert res.returncode == 1 and "crashed on local (exit code 6)" in res.stderr, res.stdout + res.stderr
    assert project.registry().get(2).exit_code == 6


def test_secrets_reach_a_run_the_standby_took_only_through_the_pipe(project):
    configure_secrets(project)
    values = {"WANDB_API_KEY": secrets.token_hex(16), "HF_TOKEN": secrets.token_hex(16)}
    write_secrets_file(project, "".join(f"{k}={v}\n" for k, v in values.items()))
    assert project.run("deploy").returncode == 0
    standby_ready(project)
    res = project.run("deploy")
    assert res.returncode == 0, res.stderr
    assert supervisor(project, 2) == pane(project, SESSION)[0]
    log = project.run_dir(2) / "train.log"
    want = [f"{k} {hashlib.sha256(v.encode()).hexdigest()}" for k, v in values.items()]
    wait_for(lambda: all(w in log.read_text() for w in want), 30, "the run's hashes of its values")
    for path in project.root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert not any(v.encode() in data for v in values.values()), path
    assert project.run("stop").returncode == 0


def test_a_standby_of_another_agent_is_never_used(project):
    project.configure(steps=100000, sleep=0.05)
    assert project.run("deploy").returncode == 0
    waiting = standby_ready(project)
    path = project.root / "standby" / "standby.json"
    path.write_text(json.dumps({**waiting, "agent": waiting["agent"] + ".old"}))  # as an earlier agent leaves it
    res = project.run("deploy")
    assert res.returncode == 0, res.stderr
    took = supervisor(project, 2)
    assert took != waiting["pid"] and cmdline(took)[-2] == "supervise"  # tmux started this one
    assert pane(project, SESSION) == (took, "exp2")
    fresh = standby_ready(project, not_pid=waiting["pid"])  # the other agent's standby is replaced (times out if not)
    assert fresh["agent"] == waiting["agent"] and cmdline(fresh["pid"])[-2:] == ["standby", str(project.root)]
    deadline = time.monotonic() + 10
    while Path(f"/proc/{waiting['pid']}").exists():  # stopped with its session
        assert time.monotonic() < deadline, cmdline(waiting["pid"])
        time.sleep(0.05)
    assert project.run("stop").returncode == 0


def test_a_tmux_that_refuses_the_one_call_handover_still_starts_the_run_in_a_fresh_session(project, tmp_path):
    """The hand-over kills a session left under the project's name in the same tmux call (a tmux format picks it);
    where tmux refuses that call (as an old one would), the start clears the session and tmux starts the
    supervisor, as without a standby."""
    import os
    import shutil
    import stat

    project.configure(steps=100000, sleep=0.05)
    assert project.run("deploy").returncode == 0
    waiting = standby_ready(project)
    folder = tmp_path / "bin"
    folder.mkdir()
    wrapper = folder / "tmux"
    wrapper.write_text(f'#!/bin/sh\nfor a in "$@"; do [ "$a" = if-shell ] && {{ echo "unknown command: if-shell" >&2; '
                       f'exit 1; }}; done\nexec {shutil.which("tmux")} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    res = project.run("deploy", env={"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"})
    assert res.returncode == 0, res.stderr
    took = supervisor(project, 2)
    assert took != waiting["pid"] and cmdline(took)[-2] == "supervise"  # tmux started this one
    assert pane(project, SESSION) == (took, "exp2")  # in the project's session, run 1's gone
    listed = tmux(project, "list-sessions", "-F", "#{session_name}").stdout.split()
    assert sorted(listed) == sorted([SESSION, STANDBY]), listed  # run 1's session is gone, nothing else is left
    assert record(project)["pid"] == waiting["pid"]  # the standby still waits, for the next start
    assert project.run("stop").returncode == 0
