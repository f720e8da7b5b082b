"""orch's own background processes on Unix sockets (the connection keeper, the warm orch process): where they
listen, how one is started, claimed, served and tidied. Standard library only, so that either side may use it.

    path = folder() / "keeper-<name>.sock"
    sock = connect(path)                  # None: none listens
    if sock is None and spawn(path, "orchestrator.reach.keeper", "600") is None:
        sock = wait_for(path, 2.0)        # one another command started is coming up: wait for it to listen

    server = Server(path)                 # in the started process
    if server.claim():                    # the lock: one server per socket, the others exit at once
        server.bind()
        for conn in server.connections(idle=600, busy=lambda: active > 0):
            ...                           # until idle, stopped, or the socket file is removed
        server.close()                    # the socket, its start marker and an empty log go

Beside ``X.sock`` live ``X.sock.lock`` (held by the server for its whole life), ``X.spawned`` (the pid of the
server being started), ``X.owner`` (whose server it is: its home folder and orch installation, so that a command
ends only its caller's own, ``mine``) and ``X.log`` (its stderr, removed when empty). The folder is this user's alone
(0700, ``$XDG_RUNTIME_DIR/orch`` else ``/tmp/orch-<uid>``) and each socket is 0600, so two users never
reach each other's processes.
"""

from __future__ import annotations

import fcntl
import os
import stat
import sys
import time

from .errors import SafetyError

TYPE_CHECKING = False  # not typing's: every orch command imports this module, and typing costs it ~5 ms
if TYPE_CHECKING:
    import socket
    import threading
    from pathlib import Path
    from typing import Callable, Iterator

SUFFIX = ".sock"
MAX_FOLDER = 70  # a socket path has room for ~100 bytes
SPAWN_WAIT = 10.0  # s a server being started is given before another command starts one
TICK = 0.5  # s between the checks of a server waiting for connections


def folder() -> Path:
    """This user's private folder for orch's sockets, made when missing; ``SafetyError`` when it is not private."""
    from pathlib import Path

    return Path(folder_name())


def folder_name() -> str:
    """``folder()`` as a string: the ``orch`` command names its warm process's socket with it before it imports
    pathlib (~9 ms), which it does not need when a warm process runs the command."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if not os.path.isabs(runtime) or len(runtime) > MAX_FOLDER:
        runtime = ""
    base = os.path.join(runtime, "orch") if runtime else f"/tmp/orch-{os.getuid()}"
    hint = "set [ssh] persist = 0 to connect directly (and ORCH_WARM=0 to run commands here)"
    try:
        if runtime:
            os.makedirs(runtime, exist_ok=True)
        try:
            os.mkdir(base, mode=0o700)
        except FileExistsError:
            pass  # made earlier (or not a folder: said below)
        info = os.lstat(base)
    except OSError as exc:
        raise SafetyError(f"cannot create the keeper folder {base}: {exc.strerror}",
                          hint=f"{hint}, or fix XDG_RUNTIME_DIR") from exc
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
        raise SafetyError(f"the keeper folder {base} is not a private folder of this user (owner {info.st_uid}, "
                          f"mode {stat.S_IMODE(info.st_mode):o})",
                          hint=f"remove it (another user may have made it), or {hint}")
    return base


def _stem(path: Path | str) -> str:
    path = str(path)
    return path[:-len(SUFFIX)] if path.endswith(SUFFIX) else path


def owner() -> str:
    """Whose servers this process starts and uses: its home folder and orch installation (the folder is per uid,
    and on a shared account several people, homes or checkouts share it)."""
    return f"{os.path.expanduser('~')}\n{sys.prefix}\n"


def mine(path: Path | str) -> bool:
    """Whether the server at ``path`` is this caller's (same home and installation, by its ``X.owner``); one
    that wrote none (an older orch) is not."""
    try:
        with open(f"{_stem(path)}.owner") as fh:
            return fh.read() == owner()
    except OSError:
        return False


def connect(path: Path | str, timeout: float = 2.0) -> socket.socket | None:
    """A connection to the server at ``path``; None when none listens there."""
    import socket  # here: the ``orch`` process that hands its command to the warm process never needs it

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        return None
    sock.settimeout(None)
    return sock


def server_pid(path: Path | str) -> int | None:
    """The pid of the live process started for ``path`` (by its start marker), or None."""
    try:
        with open(f"{_stem(path)}.spawned") as fh:
            pid = int(fh.read().strip() or 0)
        if pid <= 0:
            return None
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            serves = str(path).encode() in fh.read().split(b"\0")
    except (OSError, ValueError, IndexError):
        return None  # no marker, or its process is gone (crashed, or exited idle)
    return pid if serves and state not in (b"Z", b"X") else None


def alive(pid: int) -> bool:
    """Whether process ``pid`` lives (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def starting(path: Path | str) -> bool:
    """Whether a server started for ``path`` a moment ago is still coming up: commands meanwhile start no more."""
    try:
        recent = time.time() - os.stat(f"{_stem(path)}.spawned").st_mtime < SPAWN_WAIT
        with open(f"{_stem(path)}.spawned") as fh:
            pid = int(fh.read().strip() or 0)
        with open(f"/proc/{pid}/stat", "rb") as fh:  # alive: forked a moment ago, it may not have exec'd yet
            state = fh.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, ValueError, IndexError):
        return False
    return recent and pid > 0 and state not in (b"Z", b"X")


def spawn(path: Path | str, module: str, *args: str, stdin: int | None = None) -> int | None:
    """Start ``python -m module PATH ARGS…`` in a session of its own (Ctrl-C in this terminal does not reach it),
    stderr to ``X.log``, ``stdin`` (a descriptor) its standard input, unless one started for ``path`` is still
    coming up; its pid (None: none started).
    Commands that find no server at the same moment take turns on the start marker: one starts it."""
    import subprocess  # here: every command imports this module, few start a server

    stem = _stem(path)
    try:
        marker = os.open(f"{stem}.spawned", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(marker, fcntl.LOCK_EX)  # held for a moment: while one command starts the server
        if starting(path):
            return None
        log = os.open(f"{stem}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            pid = subprocess.Popen([sys.executable, "-m", module, str(path), *args], cwd="/",
                                   stdin=subprocess.DEVNULL if stdin is None else stdin, stdout=subprocess.DEVNULL,
                                   stderr=log, start_new_session=True, close_fds=True).pid
        finally:
            os.close(log)
        os.ftruncate(marker, 0)
        os.pwrite(marker, str(pid).encode(), 0)
    except OSError:
        return None
    finally:
        os.close(marker)
    return pid


def wait_for(path: Path | str, limit: float) -> socket.socket | None:
    """A connection to the server started for ``path`` a moment ago, once it listens (at most ``limit`` s); None
    when none is coming up, or it did not listen in time."""
    deadline = time.monotonic() + limit
    while starting(path):
        sock = connect(path)
        if sock is not None:
            return sock
        if time.monotonic() > deadline:
            return None
        time.sleep(0.02)
    return connect(path)


def remove_if_stale(path: Path) -> bool:
    """Remove the socket at ``path`` when no server holds it (one that crashed left it); whether it was."""
    try:
        lock = os.open(f"{path}.lock", os.O_CREAT | os.O_RDWR, 0o600)
    except OSError:
        return False
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # its server is alive, or one is starting on it
    else:
        path.unlink(missing_ok=True)
        return True
    finally:
        os.close(lock)


class Server:
    """The listening end at ``path``: claimed by a lock for the process's life, so that of two started at once
    one serves and the other exits; a socket a crashed server left is replaced."""

    def __init__(self, path: Path) -> None:
        import threading

        self.path = path
        self.last = time.monotonic()
        self._lock_fd: int | None = None
        self._listener: socket.socket | None = None
        self._guard = threading.Lock()

    def claim(self) -> bool:
        """Take the socket's lock; False when another server holds it (this one then has nothing to do)."""
        fd = os.open(f"{self.path}.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._lock_fd = fd
        return True

    def bind(self) -> None:
        """Listen at ``path`` (0600), replacing a socket a crashed server left there."""
        assert self._lock_fd is not None, "claim() first"
        import socket

        self.path.unlink(missing_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            listener.bind(str(self.path))
        finally:
            os.umask(old)
        listener.listen(64)
        listener.settimeout(TICK)
        self._listener = listener
        stem = _stem(self.path)
        fd = os.open(f"{stem}.owner.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, owner().encode())
        finally:
            os.close(fd)
        os.replace(f"{stem}.owner.tmp", f"{stem}.owner")

    def touch(self) -> None:
        """Restart the idle clock (a request just ended)."""
        with self._guard:
            self.last = time.monotonic()

    def connections(self, idle: float | Callable[[], float], busy: Callable[[], bool] = lambda: False,
                    stop: threading.Event | None = None) -> Iterator[socket.socket]:
        """Each connection as it comes (blocking, no timeout), until ``stop`` is set, the socket file is
        removed (nobody can reach this server), or ``idle`` seconds (or ``idle()``, asked each time: a server told
        its idle time after it started) pass with nothing ``busy`` and no connection."""
        import socket

        assert self._listener is not None, "bind() first"
        while True:
            try:
                conn, _ = self._listener.accept()
            except socket.timeout:
                with self._guard:
                    quiet = time.monotonic() - self.last
                if (stop is not None and stop.is_set()) or not self.path.exists() or \
                        (quiet > (idle() if callable(idle) else idle) and not busy()):
                    return
                continue
            if stop is not None and stop.is_set():  # woken to stop (``wake``), or a caller just as it stops
                conn.close()
                return
            self.touch()
            conn.settimeout(None)
            yield conn

    def wake(self) -> None:
        """Wake ``connections`` waiting in accept, so that a ``stop`` just set ends it now rather than on its next
        check (up to ``TICK`` later)."""
        sock = connect(self.path)
        if sock is not None:
            sock.close()

    def close_in_child(self) -> None:
        """In a child forked from the server: let go of the listener and the lock, removing nothing (the server
        still serves; once it exits, a new one can claim the socket while this child runs on)."""
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # the lock stays the server's: it is the same open file, still open there
            self._lock_fd = None

    def close(self) -> None:
        """Stop listening; remove the socket (ours: the lock kept any other server from binding it), the start
        marker, and the log when nothing was written to it; release the lock. Safe to call twice."""
        if self._listener is not None:
            self.path.unlink(missing_ok=True)
            self._listener.close()
            self._listener = None
        if self._lock_fd is None:
            return
        stem = _stem(self.path)
        for name, only_empty in ((f"{stem}.spawned", False), (f"{stem}.owner", False), (f"{stem}.log", True)):
            try:
                if not only_empty or os.path.getsize(name) == 0:
                    os.unlink(name)
            except OSError:
                pass
        os.close(self._lock_fd)
        self._lock_fd = None
