"""The transport interface every target implementation follows."""

from __future__ import annotations

import abc
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Optional, Union

from ...errors import InputError



@dataclass(frozen=True)
class FileRange:
    """``length`` bytes of the open file ``fd`` from ``offset``, as a piece of a stream: a transport that can move
    them without reading them into this process (``os.splice`` into ssh's stdin) does; ``pieces`` reads them.
    ``name`` says which file, when it turns out shorter than that."""

    fd: int
    offset: int
    length: int
    name: str

    def read(self) -> bytes:
        try:
            data = os.pread(self.fd, self.length, self.offset)
        except OSError as exc:
            raise InputError(f"cannot read {self.name}: {exc.strerror}", hint="check the file and deploy again") \
                from None
        if len(data) < self.length:
            raise self.shrank()
        return data

    def shrank(self) -> InputError:
        return shrank(self.name)


def shrank(name: str) -> InputError:
    """A file that got shorter while it was hashed or sent."""
    return InputError(f"{name} shrank while it was being sent", hint="deploy again once it has stopped changing")


#: what a command reads on stdin: bytes, or a stream of byte chunks (sent as they are produced)
Input = Union[bytes, Iterable[Union[bytes, FileRange]], None]
#: where a streamed command's stdout goes, piece by piece
Output = Optional[Callable[[bytes], None]]
PIECE = 1 << 16


def pieces(data: Input) -> Iterator[bytes]:
    """``data`` as chunks to send, without copying a bytes payload; a ``FileRange`` read here."""
    if data is None:
        return
    if isinstance(data, (bytes, bytearray, memoryview)):
        view = memoryview(data)
        for start in range(0, len(view), PIECE):
            yield view[start:start + PIECE]
        return
    for piece in data:
        yield piece.read() if isinstance(piece, FileRange) else piece


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

    Besides ``run`` and ``put``: ``run_agent`` (an agent call), ``run_bulk`` (one with a big stream), ``direct``
    (the transport with a connection of its own), ``connect``/``alive``/``local_port`` (the connection),
    ``open_channel``/``open_tunnel`` (streams left to the caller: terminals, resident agents, port forwards).
    Code outside this package uses only these, never a transport's private attributes.

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
    #: what the machine must be (``reach/identity.Expected``), checked by the agent in every answer; None: any
    identity: Any = None

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

    def run_agent(self, argv: list[str], *, input: Input = None, timeout: float | None = None,
                  stall: float | None = None, output: Output = None) -> Result:
        """``run`` for an agent call; a transport that can hand it to an agent already serving there does."""
        given = {k: v for k, v in (("stall", stall), ("output", output)) if v is not None}
        return self.run(argv, input=input, timeout=timeout, **given)  # only these: a run may take no more

    def run_bulk(self, argv: list[str], *, open: Callable[[], Input], stall: float | None = None) -> Result:
        """``run_agent`` for a big stream on stdin (a push): ``open()`` makes the stream, again if the bytes must go
        another way than the first one tried. The SSH transport sends it through the OpenSSH client where one is
        installed; the others run it as any command."""
        return self.run_agent(argv, input=open(), stall=stall)

    def direct(self) -> "Transport":
        """The transport that holds a connection of its own (a terminal or a port forward needs one): itself,
        unless its commands go through another process."""
        return self

    def retarget(self, host: str) -> None:
        """Reach ``host`` from now on, instead of the host this transport was made for (a CT that the API says
        moved there); an open connection is closed. A transport that has no host cannot."""
        from ...errors import TransportError

        raise TransportError(f"{self.description} cannot be moved to {host}", hint="run the command again")

    def connect(self) -> None:
        """Reach the target now rather than on first use (a no-op where there is no connection to open)."""

    def alive(self) -> bool:
        """Whether the connection is open now (one that was never opened, or was lost, is not)."""
        return True

    def local_port(self) -> int | None:
        """This end's TCP port of the open connection, where there is one."""
        return None

    @property
    def answer_timeout(self) -> float:
        """Seconds the target is given to answer a new connection or channel."""
        return 10.0

    def open_channel(self, argv: list[str] | None, *, pty: tuple[str, int, int] | None = None) -> Any:
        """``argv`` started on a channel of its own, its streams left to the caller as they come: what a
        terminal, a streamed command and a resident agent need. ``pty`` (term, columns, rows) asks for a
        terminal first; ``argv`` None is a login shell on it. The channel is the SSH library's
        (``send``/``recv``/``recv_stderr``/``recv_exit_status``, ``close``)."""
        raise InputError(f"cannot open an interactive session through {self.description}",
                         hint="reach the node over SSH ([proxmox] node_ssh)")

    def open_tunnel(self, host: str, port: int, origin: tuple[str, int]) -> Any:
        """A channel to ``host:port`` as the target sees it, for a connection from ``origin`` (what ``ssh -L``
        carries); a channel as ``open_channel``'s."""
        raise InputError(f"cannot forward a port through {self.description}",
                         hint="forward through an SSH target")

    def close(self) -> None:
        """Release the connection, if any. Safe to call twice."""

    def __enter__(self) -> "Transport":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
