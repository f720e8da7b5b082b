"""The ``orch`` command's side of the warm process: hand it this terminal and the command, wait for the code.

    code = run(["status"])   # None: no warm process took it (run the command here instead)
    start_later()            # then one starts in the background for the next commands

``run`` is all the ``orch`` process does when a warm process takes the command, so it loads only what Python's
start-up has loaded already and a few small built-in modules (``_socket``, ``_signal``, ``marshal``, ``array``,
Python's own sha256, ``resource`` for the limits): no ``socket``, ``signal`` or ``enum``, no ``json`` (and its
``re``), no ``hashlib`` (OpenSSL's), no ``struct``.
"""

from __future__ import annotations

import os
import sys

from .. import sockets
from ..errors import OrchError

CODE_SIZE = 4  # a pid or an exit code: 4 bytes, big-endian, signed (the server's ``struct`` ">i")
DONE = b"."  # after the exit code: what the command readies for the next ones (a keeper's socket) is in place
MODULE = "orchestrator.warm.server"  # what a warm process runs: python -m MODULE SOCKET IDLE_SECONDS
# s a warm process waits for the next command before it exits: longer than a connection keeper ([ssh] persist,
# 10 min), since it holds no connection, lock or open file, only memory; so the first deploy after a break pays
# for a new connection, not for loading orch again (~0.5 s here)
IDLE = 3600.0


def pack(value: int) -> bytes:
    return value.to_bytes(CODE_SIZE, "big", signed=True)


def unpack(data: bytes) -> int:
    return int.from_bytes(data, "big", signed=True)


def _sha256():
    """Python's own sha256 (built in), without importing OpenSSL's through ``hashlib``; the same digest."""
    for name in ("_sha2", "_sha256"):  # 3.12+, 3.11
        try:
            return __import__(name).sha256()
        except ImportError:
            continue
    import hashlib

    return hashlib.sha256()


def socket_path() -> str:
    """The warm orch process's socket: its name covers every file of the installed orch, so a changed orch never
    runs a command in a process that loaded the old one. Installed (a wheel, by pip, uv or pipx), the installer's
    RECORD names each of its files with its sha256 and is written again by every install: its text is read (one
    file, where stating all ~250 of orch's takes 1.5-3 ms of every command). Anywhere else (a checkout, an editable
    install) every file is stated: its names, sizes and times."""
    pkg = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    h = _sha256()
    h.update(f"{os.path.expanduser('~')}\0{sys.prefix}".encode())
    record = _record(pkg)
    if record is not None:
        h.update(b"RECORD\0" + pkg.encode() + b"\0" + record)
        return os.path.join(sockets.folder_name(), f"warm-{h.hexdigest()[:12]}{sockets.SUFFIX}")
    for where, dirs, files in os.walk(pkg):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith((".py", ".yaml")):
                st = os.stat(os.path.join(where, name))
                h.update(f"{where}/{name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return os.path.join(sockets.folder_name(), f"warm-{h.hexdigest()[:12]}{sockets.SUFFIX}")


def _record(pkg: str) -> bytes | None:
    """The RECORD an installer wrote for the orch installed at ``pkg`` (beside it, in ``orch-VERSION.dist-info``),
    when it lists this very file; None for a checkout or an editable install (no RECORD there lists orch's files)."""
    from .. import __version__

    path = os.path.join(os.path.dirname(pkg), f"orch-{__version__}.dist-info", "RECORD")
    try:
        with open(path, "rb") as fh:
            text = fh.read()
    except OSError:
        return None
    mine = os.path.relpath(os.path.realpath(__file__), os.path.dirname(pkg)).replace(os.sep, "/")
    return text if f"\n{mine},".encode() in text else None


def _recv_exact(sock, size: int) -> bytes | None:
    buf = b""
    while len(buf) < size:
        try:
            chunk = sock.recv(size - len(buf))
        except InterruptedError:
            continue
        except OSError:
            return None
        if not chunk:
            return None
        buf += chunk
    return buf


def _connect(path: str):
    """A connection to the warm process at ``path`` (``_socket``'s, without the ``socket`` module); None when none
    listens there."""
    import _socket

    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return None
    return sock


def _send(sock, data: bytes, fds: list[int]) -> None:
    """``data`` with the descriptors ``fds`` attached to its first byte (SCM_RIGHTS), all of it sent."""
    import _socket
    from array import array

    sent = sock.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, array("i", fds))])
    while sent < len(data):
        sent += sock.send(data[sent:])


def run(argv: list[str]) -> int | None:
    """The command's exit code, run by a warm process; None when none took it (nothing was run)."""
    import _signal
    import marshal

    try:
        path = socket_path()
        cwd = os.getcwd()
    except (OrchError, OSError):
        return None
    sock = _connect(path)
    if sock is None:
        return None
    umask = os.umask(0o022)
    os.umask(umask)
    # marshal: the warm process is this same Python (its socket's name covers sys.prefix, and it was started
    # with sys.executable), and the socket is this user's alone
    request = marshal.dumps({"argv": list(argv), "cwd": cwd, "env": dict(os.environ), "umask": umask,
                             "limits": limits()})
    fds = [fd for fd in (0, 1, 2) if _valid(fd)]
    if len(fds) < 3:
        sock.close()
        return None  # a closed standard stream: run here, where Python copes with it as usual
    child: list[int] = []  # the pid of the warm process's child running the command, once it said it
    forwarded: list[int] = []

    def forward(signum: int, _frame: object) -> None:  # a signal before the pid came is passed on when it comes
        forwarded.append(signum)
        for pid in child:
            try:
                os.kill(pid, signum)
            except OSError:
                pass

    signals = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGQUIT)
    before = {signum: _signal.signal(signum, forward) for signum in signals}
    try:
        _send(sock, pack(len(request)) + request, fds)
        pid_bytes = _recv_exact(sock, CODE_SIZE)
    except OSError:
        pid_bytes = None
    if pid_bytes is None:  # no warm process took the command: it runs here, as if none had listened
        sock.close()
        for signum, handler in before.items():
            _signal.signal(signum, handler)
        if forwarded:
            _signal.raise_signal(forwarded[-1])
        return None
    _signal.pthread_sigmask(_signal.SIG_BLOCK, signals)  # one that comes now is passed on by forward(), once
    child.append(unpack(pid_bytes))
    pending = list(forwarded)
    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, signals)
    for signum in pending:
        try:
            os.kill(child[0], signum)
        except OSError:
            pass
    code = _recv_exact(sock, CODE_SIZE)
    if code is not None:
        _recv_exact(sock, len(DONE))  # or the child's end: the code is the command's either way
        return unpack(code)
    if forwarded:  # it died of the signal passed on to it: so does this process
        _signal.signal(forwarded[-1], _signal.SIG_DFL)
        os.kill(os.getpid(), forwarded[-1])
    sys.stderr.write("error: the command ended without an exit code: the warm orch process running it was killed\n"
                     "hint: `orch status` shows what it did on the target; run it again if it is still needed "
                     "(ORCH_WARM=0 runs commands without the warm process)\n")
    return 1


def limits() -> dict:
    """This process's resource limits (``ulimit``), by ``RLIMIT_*`` number: what its command runs under, and the runs
    it launches."""
    import resource

    return {getattr(resource, name): resource.getrlimit(getattr(resource, name))
            for name in dir(resource) if name.startswith("RLIMIT_")}


def _valid(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def start_later() -> None:
    """Start a warm process in the background for the next commands, unless one is starting already."""
    try:
        path = socket_path()
    except OrchError:
        return
    sockets.spawn(path, MODULE, str(IDLE))


def processes() -> list[dict]:
    """The warm orch processes of this user (any home or orch version): socket, pid and whether it is the
    caller's own (``mine``: same home and installation)."""
    try:
        paths = sorted(sockets.folder().glob(f"warm-*{sockets.SUFFIX}"))
    except OrchError:
        return []
    found = []
    for path in paths:
        pid = sockets.server_pid(path)
        if pid is not None:
            found.append({"socket": str(path), "pid": pid, "mine": sockets.mine(path)})
    return found


def close(everyone: bool = False) -> int:
    """Ask the caller's own warm orch processes (``everyone``: all of this user's) to exit (they tidy up their
    sockets); how many were asked."""
    import signal

    asked = 0
    for item in processes():
        if not (everyone or item["mine"]):
            continue
        try:
            os.kill(item["pid"], signal.SIGTERM)
            asked += 1
        except OSError:
            pass
    return asked
