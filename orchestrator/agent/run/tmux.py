"""tmux, through its own command line: one ``tmux -L SOCKET ...`` process per call, and nothing imported for it.

    server = Server("orch-1a2b3c4d")                     # orch's private tmux server for one root
    server.cmd("kill-session", "-t", "=orch-proj")        # .returncode, .stdout and .stderr (lists of lines)
    server.has_session("orch-proj")
    server.new_session("orch-proj", "exp7", "RUN/work", "python3 ... supervise RUN", {"PATH": "..."})
    server.new_window("orch-proj", "exp8", "RUN/work", "python3 ... supervise RUN", {})   # False: no such session

The agent asks tmux for a handful of things (make a session or a window, kill one, ask if one is there), each one
command whose arguments go to tmux as a list, never through a shell. A tmux library would cost every agent that
starts or stops a run ~50 ms of imports on the target (an agent started after a pause pays it during the deploy);
tmux's own command line is the interface its manual documents.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time

from ..protocol import AgentFailure

NEEDED = (3, 2)  # a run's session is made with its environment: ``new-session -e`` came in tmux 3.2
# what a tmux client says when the server it reached exits under it: a server exits once its last session is
# killed, and a new-session sent in that moment (a stop's kill-session, then the next queued run's start) is lost
EXITING = ("server exited unexpectedly", "lost server", "no server running")
EXITING_RETRIES = (0.02, 0.05, 0.1, 0.2, 0.4)  # s before each new try; a new server starts on the next


def too_old(version: str) -> None:
    """Refuse a tmux older than ``NEEDED`` (``tmux 3.1c``) before anything changes: its ``new-session`` would answer
    ``usage: ...``. A version that does not read as numbers (``tmux master``) is let through."""
    found = re.search(r"(\d+)\.(\d+)", version)
    if found and (int(found[1]), int(found[2])) < NEEDED:
        raise AgentFailure("agent", f"{version} on the target is too old: orch needs tmux {NEEDED[0]}.{NEEDED[1]} "
                                    "or newer (a run's session starts with its environment: tmux new-session -e)",
                           f"install tmux {NEEDED[0]}.{NEEDED[1]} or newer there (Debian 12 and Ubuntu 22.04 ship it), "
                           "and deploy again")


class TmuxError(Exception):
    """tmux refused a command (its message), or is not installed."""


class Answer:
    """What one tmux command printed: its lines without the empty ones at the end, and its exit code."""

    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode = returncode
        self.stdout = stdout.rstrip("\n").split("\n") if stdout.strip("\n") else []
        self.stderr = [line for line in stderr.split("\n") if line]


class Server:
    """One tmux server, named by its socket (``tmux -L NAME``)."""

    def __init__(self, socket_name: str, tmux_bin: str | None = None) -> None:
        self.socket_name = socket_name
        self.tmux_bin = tmux_bin or shutil.which("tmux")

    def cmd(self, *args: str) -> Answer:
        if not self.tmux_bin:
            raise TmuxError("tmux is not installed on the target")
        try:
            done = subprocess.run([self.tmux_bin, f"-L{self.socket_name}", *args], stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, encoding="utf-8", errors="backslashreplace",
                                  env=_without_tmux())
        except OSError as exc:
            raise TmuxError(f"tmux could not be run: {exc}") from None
        return Answer(done.returncode, done.stdout, done.stderr)

    def later(self, *args: str) -> None:
        """A tmux command started and not waited for: the next subprocess this process starts reaps it (or init
        does, once this process has exited). Nothing is started where tmux is not installed."""
        if not self.tmux_bin:
            return
        subprocess.Popen([self.tmux_bin, f"-L{self.socket_name}", *args], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                         env=_without_tmux())

    def has_session(self, name: str) -> bool:
        return self.cmd("has-session", "-t", f"={name}").returncode == 0

    def new_session(self, name: str, window: str, start_directory: str, command: str,
                    environment: dict | None = None) -> None:
        """A detached session ``name`` whose first window ``window`` runs ``command`` (a string tmux gives to the
        shell, as it would typed) in ``start_directory``; ``environment`` is what windows opened in it later see."""
        argv = ("new-session", "-d", "-s", name, "-n", window, "-c", start_directory, *_environment(environment),
                command)
        said = self.cmd(*argv)
        for pause in EXITING_RETRIES:  # the server was exiting (its last session just killed): it made nothing
            if said.returncode == 0 or not any(words in " ".join(said.stderr) for words in EXITING):
                break
            time.sleep(pause)
            said = self.cmd(*argv)
        self._understood(said)
        if said.returncode != 0 or said.stderr:
            raise TmuxError(" ".join(said.stderr) or f"tmux new-session exited {said.returncode}")

    def new_window(self, session: str, window: str, start_directory: str, command: str,
                   environment: dict | None = None) -> bool:
        """A window ``window`` running ``command`` in session ``session``; False when that session is not there
        (its last window ended meanwhile). tmux refusing the window for another reason raises."""
        said = self.cmd("new-window", "-d", "-t", f"={session}:", "-n", window, "-c", start_directory,
                        *_environment(environment), command)
        if said.returncode == 0 and not said.stderr:
            return True
        self._understood(said)
        if not self.has_session(session):
            return False
        raise TmuxError(" ".join(said.stderr) or f"tmux new-window exited {said.returncode}")


    def _understood(self, said: Answer) -> None:
        """A tmux that answers ``usage: ...`` does not know an option orch gives it: it is too old, said as such
        (not as a failure to report)."""
        if not said.stderr or not said.stderr[0].startswith("usage:"):
            return
        try:
            version = subprocess.run([self.tmux_bin or "tmux", "-V"], capture_output=True, text=True,
                                     timeout=10).stdout.strip() or "tmux"
        except (OSError, subprocess.TimeoutExpired):
            version = "tmux"
        too_old(version)
        raise AgentFailure("agent", f"{version} on the target refused orch's command ({said.stderr[0][:160]})",
                           f"orch needs tmux {NEEDED[0]}.{NEEDED[1]} or newer: install a newer tmux there")


def _without_tmux() -> dict | None:
    """This process's environment without ``TMUX`` (None: it has none): an agent started in a tmux pane (a
    supervisor, a rollback) must not have its commands taken for that pane's client."""
    if "TMUX" not in os.environ:
        return None
    return {key: value for key, value in os.environ.items() if key != "TMUX"}


def _environment(environment: dict | None) -> list[str]:
    return [f"-e{key}={value}" for key, value in (environment or {}).items()]
