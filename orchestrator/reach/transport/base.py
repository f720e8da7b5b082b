"""The transport interface every target implementation follows."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Optional, Union

#: what a command reads on stdin: bytes, or a stream of byte chunks (sent as they are produced)
Input = Union[bytes, Iterable[bytes], None]
#: where a streamed command's stdout goes, piece by piece
Output = Optional[Callable[[bytes], None]]
PIECE = 1 << 16


def pieces(data: Input) -> Iterator[bytes]:
    """``data`` as chunks to send, without copying a bytes payload."""
    if data is None:
        return
    if isinstance(data, (bytes, bytearray, memoryview)):
        view = memoryview(data)
        for start in range(0, len(view), PIECE):
            yield view[start:start + PIECE]
        return
    yield from data


@dataclass
class Result:
    """What a command did on the target."""

    argv: list[str]
    exit_code: int
    stdout: bytes = b""
    stderr: bytes = b""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def tail(self, lines: int = 10) -> str:
        text = (self.stderr or self.stdout).decode("utf-8", "replace").rstrip()
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class TransportStats:
    """Counters a benchmark reads: connections opened, commands run, bytes sent on stdin."""

    connections: int = 0
    commands: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    extra: dict = field(default_factory=dict)


class Transport(abc.ABC):
    """Runs argument lists on one target.

    ``run`` raises ``TransportError`` (or ``TransportTimeout``) only when the target could not be
    reached or did not answer in time; a command's own failure is a ``Result`` with a non-zero code.
    ``timeout`` bounds the whole command; ``stall`` bounds the time without progress (a byte sent or
    received), which is what a long transfer needs: it may take an hour, but never a silent minute.
    With ``output`` (where ``streams`` is true), stdout is handed to it piece by piece as it arrives, on
    the calling thread, instead of being kept in the ``Result``.
    """

    #: human-readable description of the target, e.g. ``"local"`` or ``"root@10.0.0.5:22"``
    description: str = "?"
    #: whether ``run`` takes ``output``
    streams: bool = False

    def __init__(self) -> None:
        self.stats = TransportStats()

    @abc.abstractmethod
    def run(self, argv: list[str], *, input: Input = None, timeout: float | None = None,
            stall: float | None = None, output: Output = None) -> Result:
        """Run ``argv`` on the target, feeding ``input`` on stdin, and wait for it."""

    @abc.abstractmethod
    def put(self, data: bytes, path: str, mode: int = 0o644) -> None:
        """Write ``data`` to ``path`` on the target atomically (temp file + rename).

        The parent directory is created when missing.
        """

    def close(self) -> None:
        """Release the connection, if any. Safe to call twice."""

    def __enter__(self) -> "Transport":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
