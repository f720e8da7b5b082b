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
        try:  # a session of its own: Ctrl-C in the terminal reaches orch, not the agent mid-step
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
        except OSError as exc:
            raise TransportError(f"cannot run {argv[0]!r} locally: {exc.strerror}",
                                 hint="check that it is installed and on PATH") from exc
        try:
            out, err = proc.communicate(input or b"", timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            proc.kill()
            proc.communicate()
            raise TransportTimeout(
                f"{argv[0]} did not finish within {timeout:g} s on the local target",
                hint="raise [ssh] command_timeout in orch.toml if the target is just slow",
            ) from exc
        except BaseException:
            # interrupted: hang up like a dropped SSH channel would; the agent finishes its step, starts no other
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
            raise
        self.stats.bytes_received += len(out) + len(err)
        return Result(list(argv), proc.returncode, out, err)

    def put(self, data: bytes, path: str, mode: int = 0o644) -> None:
        from ..agent.layout import write_atomic

        self.stats.bytes_sent += len(data)
        try:
            write_atomic(path, data, mode)
        except OSError as exc:
            raise TransportError(f"cannot write {path}: {exc.strerror}",
                                 hint="check the permissions of the target's root folder") from exc
