"""The local target: this machine, through subprocesses."""

from __future__ import annotations

import subprocess

from ..errors import TransportError, TransportTimeout
from .base import Result, Transport


class LocalTransport(Transport):
    description = "local"

    def run(self, argv: list[str], *, input: bytes | None = None, timeout: float | None = None) -> Result:
        self.stats.commands += 1
        self.stats.bytes_sent += len(input or b"")
        try:
            proc = subprocess.run(argv, input=input or b"", capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise TransportTimeout(
                f"{argv[0]} did not finish within {timeout:g} s on the local target",
                hint="raise [transport] command_timeout in orch.toml if the target is just slow",
            ) from exc
        except OSError as exc:
            raise TransportError(f"cannot run {argv[0]!r} locally: {exc.strerror}",
                                 hint="check that it is installed and on PATH") from exc
        self.stats.bytes_received += len(proc.stdout) + len(proc.stderr)
        return Result(list(argv), proc.returncode, proc.stdout, proc.stderr)

    def put(self, data: bytes, path: str, mode: int = 0o644) -> None:
        from ..agent.layout import write_atomic

        self.stats.bytes_sent += len(data)
        try:
            write_atomic(path, data, mode)
        except OSError as exc:
            raise TransportError(f"cannot write {path}: {exc.strerror}",
                                 hint="check the permissions of the target's root folder") from exc
