"""Into the run on the local target: attach on a real pseudo-terminal, exec with its exit code, a shell,
and the refusals (no terminal, no run, forward to a port that is already local).

Everything is real: the run in tmux on orch's private socket, the CLI as a subprocess on a pty.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.watch.into import parse_ports, tmux_socket
from tests.conftest import tmux_socket as conftest_socket

DETACH = b"\x02d"  # C-b d


def cli_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator.cli.main", *args]


def drive_pty(argv: list[str], cwd: Path, steps: list[tuple[str, bytes]], timeout: float = 30,
              env: dict | None = None) -> tuple[int, str]:
    """Run ``argv`` on a 100x30 pseudo-terminal; for each step, wait for its text, then type its bytes."""
    import fcntl
    import pty
    import select
    import struct
    import termios

    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(cwd)
        os.execvpe(argv[0], argv, dict(os.environ, **(env or {})))
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    seen, pending = b"", list(steps)
    deadline = time.monotonic() + timeout
    try:
        while True:
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                raise AssertionError(f"{argv} did not finish in {timeout} s; waiting for {pending[:1]}: {seen!r}")
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:
                    break
                if not chunk:
                    break
                seen += chunk
            if pending and pending[0][0].encode() in seen:
                # tmux asks the terminal what it is right after drawing and reads keys typed before it gives
                # up waiting for the answer as part of one: type like a person, a moment after the screen
                time.sleep(0.5)
                seen += b"\n<typed>\n"  # later expectations match only what came after this answer
                os.write(fd, pending.pop(0)[1])
    finally:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), seen.decode("utf-8", "replace")


def _deploy(project) -> dict:
    project.configure(steps=100000, sleep=0.05)
    res = project.cli("deploy", "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)["experiment"]


def test_socket_name_is_the_agents():
    assert tmux_socket("/a/b/") == conftest_socket("/a/b") == tmux_socket("/a//b")


def test_ports_parse_and_bad_ones_are_refused():
    assert parse_ports("6006") == (6006, 6006)
    assert parse_ports("6006:16006") == (6006, 16006)
    for bad in ("x", "0", "70000", "1:2:3", ""):
        with pytest.raises(Exception) as info:
            parse_ports(bad)
        assert info.value.exit_code == 2


def test_exec_runs_in_the_work_folder_and_passes_the_exit_code(project):
    exp = _deploy(project)
    res = subprocess.run(cli_argv("exec", "--", "sh", "-c", "pwd; echo to-stderr >&2; exit 7"), cwd=project.path,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 7, res.stderr
    assert res.stdout.strip() == str(project.run_dir(exp["id"]) / "work")
    assert res.stderr.strip() == "to-stderr"
    ok = subprocess.run(cli_argv("exec", "--", "ls"), cwd=project.path, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "train.py" in ok.stdout.split()
    piped = subprocess.run(cli_argv("exec", "--", "cat"), cwd=project.path, input="piped\n", capture_output=True,
                           text=True, timeout=60)
    assert piped.returncode == 0 and piped.stdout == "piped\n"


def test_exec_gives_the_command_the_runs_variables(project):
    """What the run was given ([project] env, orch's ORCH_* variables) reaches a command run beside it, read from
    the run's own record: a setting changed in orch.toml since the deploy is the run's, not the new one."""
    exp = _deploy(project)
    record = json.loads((project.run_dir(exp["id"]) / "launch.json").read_text())["env"]
    project.configure(steps=7)  # after the deploy: not the run's
    names = ["ORCH_EXPERIMENT_ID", "ORCH_CHECKPOINT_DIR", "ORCH_RUN_DIR", "ORCH_REVISION", "TINYLM_STEPS"]
    res = subprocess.run(cli_argv("exec", "--", sys.executable, "-c", "import json, os, sys; print(json.dumps("
                                  "{k: os.environ.get(k) for k in sys.argv[1:]}))", *names),
                         cwd=project.path, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    seen = json.loads(res.stdout)
    assert seen == {k: record[k] for k in names}
    assert seen["ORCH_EXPERIMENT_ID"] == str(exp["id"]) and seen["TINYLM_STEPS"] == "100000"


def test_exec_without_an_experiment_says_so(project):
    res = subprocess.run(cli_argv("exec", "--", "true"), cwd=project.path, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 7
    assert "error: no experiment on local" in res.stderr and "hint:" in res.stderr


def test_attach_shows_the_pane_and_detaching_leaves_the_run_running(project):
    _deploy(project)
    code, screen = drive_pty(cli_argv("attach"), project.path, [("python3 train.py", DETACH)])
    assert code == 0, screen
    assert "orch: experiment run in" in screen and "detached" in screen
    status = project.cli("status", "--json")
    assert json.loads(status.stdout)["state"] == "running"


def test_attach_refuses_without_a_terminal_or_a_run(project):
    res = subprocess.run(cli_argv("attach"), cwd=project.path, stdin=subprocess.DEVNULL, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2
    assert "error: orch attach needs a terminal" in res.stderr and "hint:" in res.stderr
    code, screen = drive_pty(cli_argv("attach"), project.path, [])
    assert code == 7, screen
    assert "no run of project tinylm is alive on local" in screen


def test_ssh_opens_a_shell(project):
    code, screen = drive_pty(cli_argv("ssh"), project.path,
                             [("", b"echo marker-$((6*7))\r"), ("marker-42", b"exit 3\r")], env={"SHELL": "/bin/sh"})
    assert code == 3, screen


def test_ssh_starts_in_the_work_folder_of_the_latest_run(project):
    exp = _deploy(project)
    code, screen = drive_pty(cli_argv("ssh"), project.path, [("", b"echo at-$(pwd)-end\r"), ("-end", b"exit\r")],
                             env={"SHELL": "/bin/sh"})
    assert code == 0, screen
    assert f"at-{project.run_dir(exp['id']) / 'work'}-end" in screen


def test_ssh_gives_the_shell_the_runs_variables(project):
    exp = _deploy(project)
    code, screen = drive_pty(cli_argv("ssh"), project.path,
                             [("", b"echo id-$ORCH_EXPERIMENT_ID-steps-$TINYLM_STEPS-end\r"), ("-end", b"exit\r")],
                             env={"SHELL": "/bin/sh"})
    assert code == 0, screen
    assert f"id-{exp['id']}-steps-100000-end" in screen


def test_forward_on_the_local_target_says_it_is_already_local(project):
    res = project.cli("forward", "6006")
    assert res.exit_code == 2
    assert "already local" in res.output
