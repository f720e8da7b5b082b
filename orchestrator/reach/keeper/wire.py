"""Frames on the keeper's Unix socket: one type byte, a 4-byte big-endian length, the body.

    client -> keeper   H (JSON request)  I (stdin bytes)* E (end of stdin)
    keeper -> client   O (stdout bytes)* then R (JSON result, with stderr) or F (JSON error)
"""

from __future__ import annotations

import json
import socket
import struct

HEAD = struct.Struct(">cI")
MAX_BODY = 1 << 24


class Closed(Exception):
    """The other side closed the socket (or sent something that is not a frame)."""


def send(sock: socket.socket, kind: bytes, body: bytes | memoryview = b"") -> None:
    sock.sendall(HEAD.pack(kind, len(body)))
    if len(body):
        sock.sendall(body)


def send_json(sock: socket.socket, kind: bytes, obj: object) -> None:
    send(sock, kind, json.dumps(obj, separators=(",", ":")).encode())


def _exactly(sock: socket.socket, size: int) -> bytes:
    buf = bytearray()
    while len(buf) < size:
        chunk = sock.recv(min(size - len(buf), 1 << 16))
        if not chunk:
            raise Closed("the socket closed mid-frame" if buf else "the socket closed")
        buf += chunk
    return bytes(buf)


def recv(sock: socket.socket) -> tuple[bytes, bytes]:
    """The next frame as (type, body); ``Closed`` at the end of the stream."""
    kind, size = HEAD.unpack(_exactly(sock, HEAD.size))
    if size > MAX_BODY:
        raise Closed(f"a frame of {size} bytes is not one of ours")
    return kind, _exactly(sock, size) if size else b""
