"""A terminal, a command's streams or a TCP port, joined to a target: what attach, exec, ssh and forward need.

``Transport.run`` collects a command's output; these functions pass it through as it comes instead:

    terminal(transport, argv)   argv on a PTY on the target (None: a login shell, in a folder), the terminal raw
    stream(transport, argv)     argv's stdout/stderr passed through as they arrive, stdin when it is not a TTY
    forward(ssh, host, port, …) 127.0.0.1:LOCAL here -> host:port as seen from the SSH destination

A CT reached through its node is the node's transport with ``pct exec <vmid> --`` in front of the argv
(``pct exec`` gives the command a PTY in the CT when its own stdin is one). The channels come from the
transport's ``open_channel``/``open_tunnel`` (``ssh.py`` quotes the command and translates paramiko's failures);
the SSH connection is ``SshTransport``'s own, opened with its host-key checks.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import threading
from typing import Any, Callable

from ...errors import InputError, TransportError
from .base import Transport
from .local import LocalTransport
from .pct import LOGIN_SHELL, PctTransport
from .ssh import SshTransport

_CHUNK = 1 << 15


def route(transport: Transport, argv: list[str]) -> tuple[Transport, list[str]]:
    """The transport that really runs a command, and the argv it runs: pct hops become ``pct exec`` prefixes."""
    while isinstance(transport, PctTransport):
        argv = ["pct", "exec", str(transport.vmid), "--", *argv]
        transport = transport.node
    return direct(transport), argv


def direct(transport: Transport) -> Transport:
    """A terminal or a port forward needs a connection of its own, not one the keeper holds."""
    return transport.direct()


_SSH_SHELL = 'exec "${SHELL:-/bin/sh}" -l'


def login_shell(transport: Transport, cwd: str | None) -> list[str]:
    """The argv of a login shell on the target, started in ``cwd`` (a constant script; the folder is an
    argument): the one ``terminal`` runs for None, for a caller that puts something in front of it."""
    if isinstance(transport, LocalTransport):
        return [os.environ.get("SHELL") or "/bin/sh", "-l"]  # in cwd: the local process starts there
    shell = LOGIN_SHELL if isinstance(transport, PctTransport) else _SSH_SHELL
    return ["sh", "-c", 'cd -- "$1" 2>/dev/null; ' + shell, "sh", cwd or "."]


def terminal(transport: Transport, argv: list[str] | None, cwd: str | None = None) -> int:
    """Run ``argv`` (None: a login shell, started in ``cwd`` when it is given) on a PTY on the target, joined
    to this terminal; its exit code."""
    if argv is None and (cwd is not None or isinstance(transport, PctTransport)) \
            and not isinstance(transport, LocalTransport):
        argv = login_shell(transport, cwd)
    if argv is not None and isinstance(transport, PctTransport):  # pct passes the node's env; make TERM ours
        argv = ["env", f"TERM={_term()}", *argv]
    base, full = route(transport, argv or [])
    if isinstance(base, LocalTransport):
        env = {k: v for k, v in os.environ.items() if k != "TMUX"}  # attaching from inside tmux is fine
        return _local(full or [os.environ.get("SHELL") or "/bin/sh", "-l"], env=env, cwd=cwd)
    chan = base.open_channel(full or None, pty=(_term(), *_size()))
    return _join_terminal(chan, base)


# the target's python becomes the program in ``cwd``: the folder and the argv only ever arrive as arguments
IN_FOLDER = ("import os, sys\n"
             "os.chdir(sys.argv[1])\n"
             "try:\n"
             "    os.execvp(sys.argv[2], sys.argv[2:])\n"
             "except OSError as exc:\n"
             "    sys.stderr.write(f'orch: cannot run {sys.argv[2]}: {exc.strerror}\\n')\n"
             "    sys.exit(127 if isinstance(exc, FileNotFoundError) else 126)\n")


def stream(transport: Transport, argv: list[str], cwd: str | None = None, python: str = "python3") -> int:
    """Run ``argv`` on the target with its output passed through as it arrives; its exit code."""
    if isinstance(transport, LocalTransport):
        return _local(argv, cwd=cwd)
    if cwd is not None:
        argv = [python, "-c", IN_FOLDER, cwd, *argv]
    base, full = route(transport, argv)
    if isinstance(base, LocalTransport):
        return _local(full)
    chan = base.open_channel(full)
    stdin_fd = _fileno(sys.stdin)
    feed = stdin_fd is not None and not os.isatty(stdin_fd)  # a pipe or file: pass it on; a terminal: don't wait
    if not feed:
        chan.shutdown_write()
    return _join_streams(chan, base, stdin_fd if feed else None)


def forward(ssh: Transport, host: str, port: int, local_port: int,
            ready: Callable[[str], None], notice: Callable[[str], None]) -> None:
    """Listen on 127.0.0.1:``local_port`` and carry each connection to ``host:port`` seen from the SSH
    destination, until Ctrl-C (KeyboardInterrupt propagates once the listener is closed)."""
    ssh = direct(ssh)
    if not isinstance(ssh, SshTransport):
        raise InputError("the target is this machine: its ports are already local",
                         hint=f"open http://127.0.0.1:{port}/ directly")
    ssh.connect()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("127.0.0.1", local_port))
    except OSError as exc:
        listener.close()
        raise InputError(f"cannot listen on 127.0.0.1:{local_port}: {exc.strerror}",
                         hint=f"pick another local port: orch forward {port}:LOCAL") from exc
    listener.listen(16)
    listener.settimeout(0.5)
    ready(f"http://127.0.0.1:{listener.getsockname()[1]}/")
    try:
        while True:
            if not ssh.alive():
                raise TransportError(f"connection to {ssh.description} lost; forwarding stopped",
                                     hint="run orch forward again")
            try:
                client, peer = listener.accept()
            except socket.timeout:
                continue
            threading.Thread(target=_carry, args=(ssh, client, peer, host, port, notice),
                             daemon=True).start()
    finally:
        listener.close()


# -- helpers ---------------------------------------------------------------------------------------

def _carry(ssh: Transport, client: socket.socket, peer: tuple, host: str, port: int,
           notice: Callable[[str], None]) -> None:
    """One forwarded connection: a direct-tcpip channel, bytes both ways until either side closes."""
    try:
        chan = ssh.open_tunnel(host, port, peer)
    except TransportError as exc:
        notice(f"{host}:{port} on the target refused the connection ({exc.message}); "
               "is the server up and listening there?")
        client.close()
        return
    try:
        ends = [client, chan]
        while True:
            ready, _, _ = select.select(ends, [], [], 1.0)
            if client in ready:
                data = client.recv(_CHUNK)
                if not data:
                    break
                chan.sendall(data)
            if chan in ready:
                data = chan.recv(_CHUNK)
                if not data:
                    break
                client.sendall(data)
    except OSError:
        pass
    finally:
        chan.close()
        client.close()


def _local(argv: list[str], cwd: str | None = None, env: dict | None = None) -> int:
    try:
        return subprocess.call(argv, cwd=cwd, env=env)
    except OSError as exc:
        raise TransportError(f"cannot run {argv[0]!r} locally: {exc.strerror}",
                             hint="check that it is installed and on PATH") from exc


def _join_terminal(chan: Any, ssh: Transport) -> int:
    """The local terminal in raw mode, window-size changes passed on, bytes both ways; restored at the end."""
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    old_winch = signal.getsignal(signal.SIGWINCH)

    def resize(*_: object) -> None:
        try:
            chan.resize_pty(*_size())
        except Exception:
            return

    signal.signal(signal.SIGWINCH, resize)
    tty.setraw(fd)
    try:
        _pump(chan, fd, [(chan.recv, sys.stdout.fileno())])
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        signal.signal(signal.SIGWINCH, old_winch)
    return _exit_code(chan, ssh)


def _join_streams(chan: Any, ssh: Transport, stdin_fd: int | None) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    out = [(chan.recv, sys.stdout), (chan.recv_stderr, sys.stderr)]
    _pump(chan, stdin_fd, out)
    return _exit_code(chan, ssh)


def _pump(chan: Any, stdin_fd: int | None, outputs: list) -> None:
    """Until the channel's output ends: its bytes to ``outputs`` (a fd or a text stream), ``stdin_fd``'s to it."""
    while True:
        watch = [chan] + ([stdin_fd] if stdin_fd is not None else [])
        ready, _, _ = select.select(watch, [], [], 1.0)
        if stdin_fd is not None and stdin_fd in ready:
            data = os.read(stdin_fd, _CHUNK)
            if data:
                chan.sendall(data)
            else:
                chan.shutdown_write()
                stdin_fd = None
        if chan in ready or chan.closed or chan.eof_received:
            moved = False
            for recv, dest in outputs:
                ready_fn = chan.recv_stderr_ready if recv == chan.recv_stderr else chan.recv_ready
                while ready_fn():
                    data = recv(_CHUNK)
                    if not data:
                        break
                    moved = True
                    _write(dest, data)
            if not moved and (chan.eof_received or chan.closed):
                return


def _write(dest: Any, data: bytes) -> None:
    if isinstance(dest, int):
        view = memoryview(data)
        while view:
            view = view[os.write(dest, view):]
        return
    dest.buffer.write(data)
    dest.buffer.flush()


def _exit_code(chan: Any, ssh: Transport) -> int:
    code = chan.recv_exit_status()
    alive = ssh.alive()
    chan.close()
    if code == -1 and not alive:
        ssh.close()
        raise TransportError(f"connection to {ssh.description} lost",
                             hint="the run on the target goes on; connect again")
    return code


def _size() -> tuple[int, int]:
    """The terminal's columns and rows; 80x24 when it reports none (a fresh pseudo-terminal)."""
    try:
        cols, rows = os.get_terminal_size(sys.stdin.fileno())
    except OSError:
        cols, rows = 0, 0
    return (cols or 80, rows or 24)


def _term() -> str:
    return os.environ.get("TERM") or "xterm-256color"


def _fileno(stream: Any) -> int | None:
    """The stream's file descriptor, or None when it has none (a test runner's in-memory stdin)."""
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None
