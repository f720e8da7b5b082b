"""A server built on orch's socket helper, for ``test_sockets.py``: ``python -m tests.unit.socket_server PATH IDLE``.

Each connection sends one word and gets an answer: ``pid`` this process's pid; ``hold`` the pid, then the
connection is kept (the server counts as busy) until the client closes it; ``fork`` the pid of a child forked
from the server, which lets go of the socket and lives on (until killed) after the server exits.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

from orchestrator import sockets


def main(path: str, idle: float) -> int:
    server = sockets.Server(Path(path))
    if not server.claim():
        return 0
    active = [0]
    lock = threading.Lock()

    def hold(conn) -> None:
        try:
            while conn.recv(64):
                pass
        finally:
            conn.close()
            server.touch()
            with lock:
                active[0] -= 1

    def answer(conn) -> None:
        word = conn.recv(16)
        if word == b"fork":
            if os.fork() == 0:
                server.close_in_child()
                conn.sendall(str(os.getpid()).encode())
                conn.close()
                signal.pause()
                os._exit(0)
            conn.close()
            return
        conn.sendall(str(os.getpid()).encode())
        if word == b"hold":
            with lock:
                active[0] += 1
            threading.Thread(target=hold, args=(conn,), daemon=True).start()
        else:
            conn.close()

    try:
        server.bind()
        for conn in server.connections(idle, busy=lambda: active[0] > 0):
            try:
                answer(conn)
            except OSError:  # a client that only checked that something listens
                conn.close()
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], float(sys.argv[2])))
