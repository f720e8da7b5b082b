"""orch's socket helper with real Unix sockets and real processes: a stale socket is replaced and tidied, of
servers started at once one serves, a server exits when idle (never while busy), a forked child lets go."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from orchestrator import sockets
from tests.conftest import wait_for

REPO = Path(__file__).resolve().parents[2]
MODULE = "tests.unit.socket_server"


@pytest.fixture
def path(monkeypatch) -> Path:
    """A socket path in the test's own runtime folder; the test server importable from the spawned process."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    return sockets.folder() / f"test-{os.getpid()}{sockets.SUFFIX}"


def ask(path: Path, word: bytes = b"pid") -> int:
    sock = sockets.connect(path)
    assert sock is not None, f"nothing listens at {path}"
    with sock:
        sock.sendall(word)
        return int(sock.recv(32))


def listening(path: Path) -> bool:
    sock = sockets.connect(path)
    if sock is not None:
        sock.close()
    return sock is not None


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def start(path: Path, idle: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", MODULE, str(path), str(idle)], cwd=REPO,
                            start_new_session=True)


def test_a_crashed_servers_socket_is_found_stale_removed_and_replaced(path):
    left = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    left.bind(str(path))  # bound, never listening, never unlinked: what a SIGKILLed server leaves
    left.close()
    assert path.exists() and not listening(path)
    assert sockets.remove_if_stale(path) and not path.exists()

    left = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    left.bind(str(path))
    left.close()
    server = start(path, 30)
    try:
        wait_for(lambda: listening(path), timeout=20, what="the server listening")
        assert ask(path) == server.pid
        assert not sockets.remove_if_stale(path) and path.exists()  # a live server's socket stays
        assert os.stat(path).st_mode & 0o777 == 0o600
    finally:
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=20)
    assert path.exists() and not listening(path)  # killed: its socket is left behind, stale
    assert sockets.remove_if_stale(path) and not path.exists()


def test_of_servers_started_at_once_one_serves_and_the_others_exit(path):
    servers = [start(path, 30) for _ in range(4)]
    try:
        wait_for(lambda: sum(s.poll() is not None for s in servers) == 3, timeout=30,
                 what="three of the four servers exiting")
        [serving] = [s for s in servers if s.poll() is None]
        assert all(s.returncode == 0 for s in servers if s is not serving)
        wait_for(lambda: listening(path), timeout=20, what="the server listening")
        assert {ask(path) for _ in range(5)} == {serving.pid}
    finally:
        for s in servers:
            if s.poll() is None:
                s.send_signal(signal.SIGTERM)
                s.wait(timeout=20)


def test_commands_that_find_no_server_start_one_between_them(path):
    found: list[socket.socket | None] = []
    together = threading.Barrier(6)

    def command() -> None:
        together.wait()
        sock = sockets.connect(path)
        if sock is None:
            sockets.spawn(path, MODULE, "30")
        found.append(sock)

    threads = [threading.Thread(target=command) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # nobody waited for the server: each command went on by itself (one that ran late on a loaded machine may have
    # found the server up already, and talks to it)
    assert len(found) == 6 and None in found, found
    for sock in found:
        if sock is not None:
            sock.close()
    pid = int(Path(str(path)[:-len(sockets.SUFFIX)] + ".spawned").read_text())
    try:
        sock = sockets.wait_for(path, 20)  # a later command waits for the one coming up, rather than start another
        assert sock is not None
        sock.close()
        assert sockets.server_pid(path) == pid
        assert sockets.spawn(path, MODULE, "30") is None  # it is up: no second one
        assert sockets.wait_for(sockets.folder() / f"none-{os.getpid()}{sockets.SUFFIX}", 20) is None  # none coming
        assert ask(path) == pid
        servers = [p for p in os.listdir("/proc") if p.isdigit() and alive(int(p))
                   and str(path).encode() in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert servers == [str(pid)]
    finally:
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not alive(pid), timeout=20, what="the server gone")


def test_an_idle_server_exits_and_tidies_up_but_never_while_busy(path):
    server = start(path, 1)
    try:
        wait_for(lambda: listening(path), timeout=20, what="the server listening")
        held = sockets.connect(path)
        assert held is not None
        held.sendall(b"hold")
        assert int(held.recv(32)) == server.pid
        time.sleep(3)  # three idle periods with one connection open
        assert server.poll() is None and path.exists()
        held.close()
        assert server.wait(timeout=30) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert not path.exists()
    again = sockets.Server(path)
    assert again.claim()  # its lock is free
    again.close()


def test_a_server_whose_socket_is_removed_exits(path):
    server = start(path, 60)
    try:
        wait_for(lambda: listening(path), timeout=20, what="the server listening")
        path.unlink()
        assert server.wait(timeout=30) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_a_spawned_servers_marker_and_empty_log_go_with_it(path):
    pid = sockets.spawn(path, MODULE, "1")
    stem = str(path)[:-len(sockets.SUFFIX)]
    assert pid is not None and Path(f"{stem}.spawned").read_text() == str(pid)
    assert Path(f"{stem}.log").exists()
    wait_for(lambda: listening(path), timeout=20, what="the server listening")
    wait_for(lambda: not alive(pid), timeout=30, what="the idle server gone")
    assert not path.exists() and not Path(f"{stem}.spawned").exists() and not Path(f"{stem}.log").exists()
    assert sockets.server_pid(path) is None and not sockets.starting(path)


def test_a_forked_child_lets_go_so_a_new_server_can_claim_the_socket(path):
    server = start(path, 1)
    child = None
    try:
        wait_for(lambda: listening(path), timeout=20, what="the server listening")
        child = ask(path, b"fork")
        assert child != server.pid and alive(child)
        assert server.wait(timeout=30) == 0  # idle: it exits, its child lives on
        assert alive(child) and not path.exists()
        again = sockets.Server(path)
        assert again.claim()  # the child holds neither the lock nor the socket
        again.close()
    finally:
        if child is not None and alive(child):
            os.kill(child, signal.SIGKILL)
        if server.poll() is None:
            server.kill()
            server.wait()


def test_a_server_told_to_stop_takes_no_more_connections_and_a_wake_ends_its_wait(path):
    """Once ``stop`` is set, a connection that comes before the server's next check is closed, not served: that is
    how ``wake`` ends a wait in accept at once (``orch connections close`` returns as the keeper exits)."""
    server = sockets.Server(path)
    assert server.claim()
    server.bind()
    stop = threading.Event()
    served: list = []
    late = None
    waiting = threading.Thread(target=lambda: served.extend(server.connections(60, stop=stop)))
    try:
        waiting.start()
        late = sockets.connect(path)  # before the stop: served
        wait_for(lambda: len(served) == 1, timeout=20, what="the first connection served")
        stop.set()
        server.wake()
        waiting.join(timeout=20)
        assert not waiting.is_alive() and len(served) == 1  # the wake's connection was not handed on
    finally:
        stop.set()
        waiting.join(timeout=20)
        for conn in served:
            conn.close()
        if late is not None:
            late.close()
        server.close()
