"""A real HTTP server standing in for a webhook (Slack, Discord, ntfy, or any JSON receiver): it records each
POST (path, headers, body) and answers ``status``. Tests start it on loopback or on the testbed's bridge."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    headers: dict
    body: bytes

    def json(self) -> dict:
        return json.loads(self.body)


class Webhook:
    def __init__(self, host: str = "127.0.0.1", status: int = 200) -> None:
        self.status = status
        self.received: list[Received] = []
        self._cond = threading.Condition()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with hook._cond:
                    hook.received.append(Received(self.path, dict(self.headers.items()), body))
                    hook._cond.notify_all()
                self.send_response(hook.status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *_args: object) -> None:
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/hooks/T0SECRET/B0SECRET/xoxsecret"

    def __enter__(self) -> "Webhook":
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def wait(self, count: int, timeout: float = 60.0) -> list[Received]:
        """The first ``count`` requests, waiting for them up to ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.received) < count:
                left = deadline - time.monotonic()
                assert left > 0, f"{count} request(s) expected, {len(self.received)} came: {self.received}"
                self._cond.wait(left)
            return list(self.received[:count])


def closed_port_url(host: str = "127.0.0.1") -> str:
    """A URL on a port nothing listens on (bound, then closed)."""
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    return f"http://{host}:{port}/hooks/T0SECRET/B0SECRET/xoxsecret"
