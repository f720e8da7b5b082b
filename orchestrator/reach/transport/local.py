"""The local target: this machine, through subprocesses."""

from __future__ import annotations

import os
import selectors
import subprocess
import time

from ...errors import TransportError, TransportTimeout
from .base import Input, Output, Result, Transport, pieces


class LocalTransport(Transport):
    description = "local"
    streams = True

    def run(self, argv: list[str], *, input: Input = None, timeout: float | None = None,
            stall: float | None = None, output: Output = None) -> Result:
        self.stats.commands += 1
        try:  # a session of its own: Ctrl-C in the terminal reaches orch, not the agent mid-step
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
        except OSError as exc:
            raise TransportError(f"cannot run {argv[0]!r} locally: {exc.strerror}",
                                 hint="check that it is installed and on PATH") from exc
        try:
            out, err = self._exchange(proc, input, timeout, stall, argv, output)
        except BaseException:
            # interrupted or timed out: hang up like a dropped SSH channel would; the agent finishes its
            # step and starts no other (a timed-out command is killed, as OpenSSH's would be by sshd)
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
            raise
        self.stats.bytes_received += len(out) + len(err)
        return Result(list(argv), proc.returncode, bytes(out), bytes(err))

    def _exchange(self, proc: subprocess.Popen, data: Input, timeout: float | None, stall: float | None,
                  argv: list[str], output: Output = None) -> tuple[bytearray, bytearray]:
        """Feed stdin piece by piece and drain stdout/stderr, all from this thread (so Ctrl-C lands here)."""
        assert proc.stdin and proc.stdout and proc.stderr
        out, err = bytearray(), bytearray()
        sources = pieces(data)
        pending = memoryview(b"")
        sel = selectors.DefaultSelector()
        for pipe, what in ((proc.stdin, "in"), (proc.stdout, out), (proc.stderr, err)):
            os.set_blocking(pipe.fileno(), False)
            sel.register(pipe.fileno(), selectors.EVENT_WRITE if what == "in" else selectors.EVENT_READ, what)
        begin = progressed = time.monotonic()
        try:
            while sel.get_map():
                for key, _ev in sel.select(0.25):
                    if key.data == "in":
                        if not pending:
                            pending = memoryview(next(sources, b""))
                            if not pending:
                                sel.unregister(key.fd)
                                proc.stdin.close()
                                continue
                        try:
                            sent = os.write(key.fd, pending)
                        except BrokenPipeError:  # it stopped reading (exited, or refused the request)
                            sel.unregister(key.fd)
                            proc.stdin.close()
                            continue
                        pending = pending[sent:]
                        self.stats.bytes_sent += sent
                    else:
                        chunk = os.read(key.fd, 1 << 20)
                        if not chunk:
                            sel.unregister(key.fd)
                            continue
                        if output is not None and key.data is out:
                            self.stats.bytes_received += len(chunk)
                            output(chunk)
                        else:
                            key.data.extend(chunk)
                    progressed = time.monotonic()
                self._check_time(proc, begin, progressed, timeout, stall, argv)
            while proc.poll() is None:
                self._check_time(proc, begin, progressed, timeout, stall, argv)
                time.sleep(0.01)
        finally:
            sel.close()
        return out, err

    def _check_time(self, proc: subprocess.Popen, begin: float, progressed: float, timeout: float | None,
                    stall: float | None, argv: list[str]) -> None:
        now = time.monotonic()
        if timeout is not None and now - begin >= timeout:
            proc.kill()
            raise TransportTimeout(f"{argv[0]} did not finish within {timeout:g} s on the local target",
                                   hint="raise [ssh] command_timeout in orch.toml if the target is just slow")
        if stall is not None and now - progressed >= stall:
            proc.kill()
            raise TransportTimeout(f"{argv[0]} made no progress for {stall:g} s on the local target",
                                   hint="check the target's disk; raise [ssh] command_timeout if it is just slow")

    def put(self, data: bytes, path: str, mode: int = 0o644) -> None:
        from ...agent.layout import write_atomic

        self.stats.bytes_sent += len(data)
        try:
            write_atomic(path, data, mode)
        except OSError as exc:
            raise TransportError(f"cannot write {path}: {exc.strerror}",
                                 hint="check the permissions of the target's root folder") from exc
