"""A standby supervisor: the next run's supervisor, started before that run, so a start waits for no Python start-up.

After each start (``runs.start``) the agent leaves one standby per orch root: ``agent.pyz standby ROOT`` as the pane
of a tmux session of its own (``orch~standby``), the supervisor's modules imported, waiting on a FIFO
(``standby/fifo`` in orch's root, 0600, in a 0700 folder). The next start renames that session to the project's
and its window to the experiment's, then writes the run folder into the FIFO: the standby becomes that run's
supervisor (``runs.supervise``) and stays the pane's process, so attach, stop and the exit record are as for a
supervisor tmux started then. The start counts as taken once the supervisor's pid file (or its exit record) is
there; a standby that is gone, belongs to another agent (pushed again, its files replaced) or does not take the
run is never waited on: the start goes the usual way (tmux starts the supervisor) and a new standby is left.
A standby that hears nothing for ``IDLE_S`` exits, and its session with it. ``[run] standby = false`` uses none, and
the start dismisses one that waits.
"""

from __future__ import annotations

import os
import re
import select
import shlex
import sys
import time
from typing import Callable

from .. import procstat
from ..layout import Layout, read_json, write_json

SESSION = "orch~standby"  # "~" is in no project's session name (orch-<project>)
DIR = "standby"
FIFO = "fifo"
RECORD = "standby.json"
IDLE_S = 600.0
TAKE_S = 30.0  # how long a start waits for the standby's supervisor to write its pid file
POLL_S = 0.002
PLAIN = re.compile(r"[\w-]+")  # a session name (orch-<project>) that a tmux format and command string take as it is

Alive = Callable[[object, object], bool]


def _paths(root: str) -> tuple[str, str, str]:
    folder = os.path.join(root, DIR)
    return folder, os.path.join(folder, FIFO), os.path.join(folder, RECORD)


def _identity(path: str) -> list | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino]


def _usable(record: object, agent_path: str, alive: Alive) -> bool:
    """Whether ``record`` is a live standby of this very agent (same zip, same file)."""
    return isinstance(record, dict) and record.get("agent") == agent_path and \
        record.get("ident") == _identity(agent_path) and alive(record.get("pid"), record.get("start"))


def _tmux_ok(server, *args: str) -> bool:
    return not server.cmd(*args).stderr


def hand_over(server, layout: Layout, agent_path: str, run_dir: str, session: str, window: str, shown: dict,
              alive: Alive, replace: bool = False, window_command: str | None = None) -> bool:
    """Start the run in ``run_dir`` with the standby as its supervisor; False (nothing started) if none takes it.
    ``replace``: a session already named ``session`` (only ended runs are left in it) is killed in the same tmux
    call; where that call fails, it may still be there. ``window_command``: the session's ``default-command``
    (what a window opened in it later runs), set in that call too."""
    _folder, fifo, record_path = _paths(layout.root)
    record = read_json(record_path)
    if not _usable(record, agent_path, alive):
        return False
    assert isinstance(record, dict)
    # one tmux call: the session and window named for the run, and what a window opened later in the session
    # sees (as new_session's environment gives it); tmux stops at the first command that fails
    commands = ["rename-session", "-t", f"={SESSION}", session, ";", "rename-window", "-t", f"={session}:", window]
    if replace and PLAIN.fullmatch(session):  # the name goes into a tmux format and a command tmux parses
        commands = ["if-shell", "-F", f"#{{S:#{{?#{{==:#{{session_name}},{session}}},1,}}}}",
                    f"kill-session -t ={session}", ";", *commands]
    for key, value in shown.items():
        commands += [";", "set-environment", "-t", f"={session}", key, value]
    if window_command is not None:
        commands += [";", "set-option", "-t", f"={session}:", "default-command", window_command]
    if not _tmux_ok(server, *commands):
        if server.has_session(session):  # renamed, then something else failed: not a session for this run
            _tmux_ok(server, "kill-session", "-t", f"={session}")
        return False  # gone meanwhile (idle exit), or another start took it
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(fd, run_dir.encode() + b"\n")
        finally:
            os.close(fd)
    except OSError:
        _tmux_ok(server, "kill-session", "-t", f"={session}")
        return False
    deadline = time.monotonic() + TAKE_S
    pid, start = record.get("pid"), record.get("start")
    while True:
        if any(os.path.exists(os.path.join(run_dir, name)) for name in ("pid.json", "exit.json")):
            return True
        if not alive(pid, start) or time.monotonic() >= deadline:  # it did not take the run
            _tmux_ok(server, "kill-session", "-t", f"={session}")
            return any(os.path.exists(os.path.join(run_dir, name)) for name in ("pid.json", "exit.json"))
        time.sleep(POLL_S)


def leave(server, layout: Layout, agent_path: str, alive: Alive) -> None:
    """Make sure a standby of this agent waits for the next start: it imports while the run starts. Its session is
    asked of tmux without waiting for the answer (a start that comes before it is up goes the usual way)."""
    _folder, _fifo, record_path = _paths(layout.root)
    record = read_json(record_path)
    if _usable(record, agent_path, alive):
        return
    if isinstance(record, dict) and server.has_session(SESSION):  # another agent's standby: replaced
        _tmux_ok(server, "kill-session", "-t", f"={SESSION}")
    command = shlex.join([sys.executable, agent_path, "standby", layout.root])
    server.later("new-session", "-d", "-s", SESSION, "-n", "standby", "-c", layout.root, command)


def dismiss(server, layout: Layout) -> None:
    """No standby for the next start (``[run] standby = false``): one left waiting by an earlier start exits."""
    _tmux_ok(server, "kill-session", "-t", f"={SESSION}")
    for path in _paths(layout.root)[1:]:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def wait(root: str) -> str | None:
    """The standby's side (``agent.pyz standby ROOT``): the run folder the next start hands over, or None once idle.

    Holding the FIFO open for writing too, it never sees an end of file; after ``IDLE_S`` it unlinks the FIFO and its
    record (no start can find it any more), reads what came meanwhile, and exits if nothing did.
    """
    layout = Layout(root)
    folder, fifo, record_path = _paths(layout.root)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)
    for path in (fifo, record_path):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    os.mkfifo(fifo, 0o600)
    fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    agent = os.path.abspath(sys.argv[0])
    write_json(record_path, {"pid": os.getpid(), "start": procstat.start(os.getpid()), "agent": agent,
                             "ident": _identity(agent), "since": time.time()})
    data = b""
    try:
        ready = select.select([fd], [], [], IDLE_S)[0]
        if not ready:
            _forget(fifo, record_path)
        while not data.endswith(b"\n"):
            try:
                chunk = os.read(fd, 4096)
            except BlockingIOError:
                if not ready:
                    return None  # idle: nothing came
                select.select([fd], [], [], 1.0)
                continue
            data += chunk
    finally:
        os.close(fd)
    _forget(fifo, record_path)
    run_dir = os.path.normpath(data.decode("utf-8", "replace").strip())
    if os.path.dirname(run_dir) != layout.runs or not os.path.isdir(run_dir):
        return None  # only a run folder of this root
    launch = read_json(os.path.join(run_dir, "launch.json"), {}) or {}
    try:
        os.chdir(str(launch.get("cwd") or run_dir))  # where tmux would have started it
    except OSError:
        pass
    return run_dir


def _forget(fifo: str, record_path: str) -> None:
    for path in (record_path, fifo):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
