"""The ``orch`` command's side of the warm process: hand it this terminal and the command, wait for the code.

    code = run(["status"])   # None: no warm process took it (run the command here instead)
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys

from ..errors import OrchError
from ..reach.keeper import place

CODE = struct.Struct(">i")


def _recv_exact(sock: socket.socket, size: int) -> bytes | None:
    buf = b""
    while len(buf) < size:
        try:
            chunk = sock.recv(size - len(buf))
        except InterruptedError:
            continue
        if not chunk:
            return None
        buf += chunk
    return buf


def run(argv: list[str]) -> int | None:
    """The command's exit code, run by a warm process; None when none took it (nothing was run)."""
    try:
        path = str(place.warm_socket_path())
        cwd = os.getcwd()
    except (OrchError, OSError):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return None
    umask = os.umask(0o022)
    os.umask(umask)
    request = json.dumps({"argv": argv, "cwd": cwd, "env": dict(os.environ), "umask": umask}).encode()
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

    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
    before = {signum: signal.signal(signum, forward) for signum in signals}
    try:
        socket.send_fds(sock, [CODE.pack(len(request)) + request], fds)
        pid_bytes = _recv_exact(sock, CODE.size)
    except OSError:
        pid_bytes = None
    if pid_bytes is None:  # no warm process took the command: it runs here, as if none had listened
        sock.close()
        for signum, handler in before.items():
            signal.signal(signum, handler)
        if forwarded:
            signal.raise_signal(forwarded[-1])
        return None
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)  # one that comes now is passed on by forward(), once
    child.append(CODE.unpack(pid_bytes)[0])
    pending = list(forwarded)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
    for signum in pending:
        try:
            os.kill(child[0], signum)
        except OSError:
            pass
    code = _recv_exact(sock, CODE.size)
    if code is not None:
        return CODE.unpack(code)[0]
    if forwarded:  # it died of the signal passed on to it: so does this process
        signal.signal(forwarded[-1], signal.SIG_DFL)
        os.kill(os.getpid(), forwarded[-1])
    sys.stderr.write("error: the command ended without an exit code: the warm orch process running it was killed\n"
                     "hint: `orch status` shows what it did on the target; run it again if it is still needed "
                     "(ORCH_WARM=0 runs commands without the warm process)\n")
    return 1


def _valid(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def start_later() -> None:
    """Start a warm process in the background for the next commands, unless one is starting already."""
    import subprocess

    try:
        path = str(place.warm_socket_path())
    except OrchError:
        return
    marker = f"{path[:-len(place.SUFFIX)]}.spawned"
    from ..reach.keeper.client import _starting

    if _starting(marker):
        return
    try:
        log = os.open(f"{path[:-len(place.SUFFIX)]}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            pid = subprocess.Popen([sys.executable, "-m", "orchestrator.warm.server", path, str(IDLE)], cwd="/",
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                                   start_new_session=True, close_fds=True).pid
        finally:
            os.close(log)
        with open(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as fh:
            fh.write(str(pid))
    except OSError:
        return


IDLE = 600.0  # s a warm process waits for the next command before it exits
