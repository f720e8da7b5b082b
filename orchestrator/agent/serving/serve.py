"""The resident agent (``agent.pyz serve``): the connection keeper runs one on a held SSH connection and sends
it request after request, so a warm agent call costs one round trip instead of a Python start on the target.

Each request is exactly what a one-shot call reads on stdin (a JSON line, then its payload). Everything the
request writes to stdout (a streaming op's frames, then the envelope) goes out in chunks, ``<hex length>\\n``
and the bytes, and a ``0\\n`` chunk ends the answer, so nothing in a log line can be mistaken for its end.
The agent exits at the end of stdin, or when its channel is hung up (the keeper does that when the orch
command a request ran for goes away, so that, as in a one-shot call, no further step starts).

A resident whose own files changed under it (orch's root removed or replaced, the agent pushed again) cannot
import what it has not imported yet: before each request it checks them, and if they changed it answers
``stale`` instead of a chunk, runs nothing and exits. The keeper then runs that request one-shot. So it does when
the root, the agent folder or its files became another user's or writable by others since it started (StrictModes,
``strict``): the one-shot call's bootstrap refuses that request, as it would had no resident been there. And so it
does when a file that each command's login environment is made from changed since it started (``LOGIN_FILES``: the
shell's startup files for a command, sshd's ``~/.ssh/environment``): the runs it starts begin from its environment,
which would be older than a fresh command's; the one-shot call, and the resident after it, read them afresh. (What
PAM sets, from ``/etc/environment`` or ``/etc/default/locale``, sshd reads once per connection: a new agent on the
held connection gets it as it was, and a run gets the change once that connection is reopened.)
"""

from __future__ import annotations

import io
import os
import sys

END = b"0\n"
STALE = b"stale\n"


class _Chunked(io.RawIOBase):
    """The private copy of the channel's stdout: each write goes out at once as one chunk."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self.fd = fd

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:  # type: ignore[override]
        if data:
            _write_all(self.fd, b"%x\n" % len(data) + bytes(data))
        return len(data)

    def fileno(self) -> int:
        return self.fd


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _stats(paths: list[str], fields: tuple[str, ...]) -> list[tuple | None]:
    """Each file's ``fields`` of its ``stat`` as it is now (None: not there)."""
    out: list[tuple | None] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            out.append(None)
            continue
        out.append(tuple(getattr(st, f) for f in fields))
    return out


IDENTITY = ("st_dev", "st_ino")  # which files: replaced ones are others
CONTENTS = ("st_ino", "st_size", "st_mtime_ns")  # what is in them: an edit in place keeps the inode


# what each SSH command's environment is made from, read afresh for every command on a connection: sshd's user
# environment, and the startup files the shell reads for a command (bash run by sshd its bashrc files, zsh its zshenv)
LOGIN_FILES = ("~/.ssh/environment", "/etc/bash.bashrc", "~/.bashrc", "/etc/zsh/zshenv", "~/.zshenv")


def login_files(home: str | None) -> list[str]:
    """``LOGIN_FILES`` with ``~`` as ``home`` (the login's HOME; without one, only the system's files)."""
    return [os.path.join(home, path[2:]) if path.startswith("~/") else path for path in LOGIN_FILES
            if home or not path.startswith("~/")]


def _unsafe(files: list[str]) -> bool:
    """Whether what the bootstrap checked before this agent started (``strict``: its root, its folder, its files)
    would be refused now: a few ``stat`` calls, made before each request."""
    from .. import strict

    if not files[0].endswith(".pyz"):
        return False  # not a pushed agent: the bootstrap checks none (nor does this)
    folder = os.path.dirname(files[0])
    return strict.problem(os.path.dirname(folder), [folder, *files]) is not None


def own_files() -> list[str]:
    """The files this agent runs from: its zip and the copy unpacked beside it."""
    agent = os.path.abspath(sys.argv[0])
    return [agent, agent[:-4] + ".d"] if agent.endswith(".pyz") else [agent]


PRELOAD = ("subprocess", "shutil", "socket")  # what launches, stops and status import late (and every op's module)


def _preload() -> None:
    """Import, while the agent waits for its first requests, what they would otherwise import as they run: a
    resident readied for the next command (and one just started) answers it as fast as a used one."""
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 (the request that needs it says why)
            pass
    try:
        from ..__main__ import OPS

        for op in OPS:  # each op's module: a one-shot call imports only its own, a resident serves them all
            OPS[op]
    except Exception:  # noqa: BLE001
        pass
    try:
        import shutil

        from ..machine.system import tmux_version

        tmux = shutil.which("tmux")
        if tmux:
            tmux_version(tmux)  # remembered for the preflight of every launch this agent serves
    except Exception:  # noqa: BLE001
        pass


def serve() -> int:
    import threading

    from ..run import launch_env

    launch_env.remember()  # as sshd gave it: the runs this resident starts begin from it, as a one-shot's would
    preload = threading.Thread(target=_preload, daemon=True)
    preload.start()
    try:
        return _answer_requests()
    finally:
        # the interpreter's shutdown with the preload still importing can crash it (SIGSEGV): a resident told to go
        # at once (stale, or hung up) waits for its imports, which take well under a second
        preload.join(timeout=30)


def _answer_requests() -> int:
    """Each request on stdin, answered in chunks, until stdin ends, the channel is hung up, or what this agent was
    started from changed (``stale``)."""
    from ..run import launch_env
    from ..__main__ import respond

    os.environ["LC_ALL"] = "C.UTF-8"  # tmux, and the text the agent reads back from it, in a UTF-8 locale
    os.environ.pop("LANGUAGE", None)
    sys.stdout.flush()
    fd = os.dup(1)  # the answers' own copy; what children print goes nowhere (a one-shot call ignores it too)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)  # nothing reads the channel's stderr between requests
    os.close(null)
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(_Chunked(fd)), encoding="utf-8", write_through=True)
    sys.stderr = open(os.devnull, "w")
    stdin = sys.stdin.buffer
    files = own_files()
    identity = _stats(files, IDENTITY)
    login = login_files(launch_env.original().get("HOME"))
    logged_in = _stats(login, CONTENTS)
    while stdin.peek(1):
        if _stats(files, IDENTITY) != identity or _unsafe(files) or _stats(login, CONTENTS) != logged_in:
            try:
                _write_all(fd, STALE)
            except OSError:
                pass
            return 0
        try:
            answer = respond(stdin)
            sys.stdout.buffer.write(answer)
            sys.stdout.buffer.flush()
            _write_all(fd, END)
        except OSError:  # the channel was hung up
            return 0
    return 0
