"""A TCP proxy on 127.0.0.1 in front of a testbed host, so a test can cut or stall a live connection."""

from __future__ import annotations

import socket
import threading


class TcpProxy:
    """Forwards ``127.0.0.1:<port>`` to ``host:port``.

    ``kill()`` closes every open connection mid-stream (the client sees EOF/reset), ``stall()``
    stops forwarding without closing (a hung path), ``close()`` also stops listening.
    ``bytes_up``/``bytes_down`` count what went through, so a test can cut after N bytes.
    """

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.bytes_up = 0
        self.bytes_down = 0
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._running = threading.Event()
        self._running.set()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.host = "127.0.0.1"
        self.port: int = self._listener.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name=f"proxy-{self.port}").start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, "bytes_up"), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, "bytes_down"), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, counter: str) -> None:
        try:
            while chunk := src.recv(65536):
                self._running.wait()
                dst.sendall(chunk)
                with self._lock:
                    setattr(self, counter, getattr(self, counter) + len(chunk))
        except OSError:
            pass
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def stall(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def kill(self) -> None:
        """Cut every open connection at once; new connections are still accepted."""
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        self._running.set()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._listener.close()
            self.kill()

    def __enter__(self) -> "TcpProxy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
