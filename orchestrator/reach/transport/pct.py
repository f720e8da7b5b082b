"""A CT reached through its Proxmox node: ``pct exec <vmid> -- argv`` over SSH to the node.

Works when the container has no sshd at all. stdin, stdout, stderr and the exit code pass
straight through; pct's own failures (exit 255 with one of its known messages) become
``TransportError`` so that they are never mistaken for the command's result.
"""

from __future__ import annotations

import re
from typing import Any

from ...errors import TransportError
from .base import Input, Output, Result, Transport

# Reads stdin into a temp file beside the target, then renames it over; $1 = path, $2 = octal mode.
# A constant: user values only ever arrive as positional arguments.
PUT_SCRIPT = r"""set -eu
dir=$(dirname -- "$1")
mkdir -p -- "$dir"
tmp=$(mktemp -- "$dir/.orch-put-XXXXXX")
trap 'rm -f -- "$tmp"' EXIT
cat > "$tmp"
sync -- "$tmp" 2>/dev/null || true
chmod -- "$2" "$tmp"
mv -f -- "$tmp" "$1"
trap - EXIT
"""

LOGIN_SHELL = 'if command -v bash >/dev/null; then exec bash -l; fi; exec sh -l'

_PCT_FAILURES = [
    (re.compile(r"container '(\d+)' not running!"),
     "CT {vmid} on {node} is not running",
     "start it (pct start {vmid} on the node, or through the Proxmox API) and retry"),
    (re.compile(r"Configuration file '([^']*)' does not exist"),
     "CT {vmid} does not exist on {node} ({detail})",
     "check the vmid; after a migration the CT lives on another node (see /cluster/resources)"),
    (re.compile(r"^(?:Unknown option: |400 )"),
     "pct on {node} refused the command line: {detail}",
     "this is a bug in orch's pct invocation; please report it with the command"),
    (re.compile(r"\bpct: (?:command )?not found"),
     "pct is not installed on {node}",
     "point the target at a Proxmox VE node, or reach the CT over SSH directly"),
]


class PctTransport(Transport):
    """Runs commands in CT ``vmid`` through ``node`` (any ``Transport`` to the node, usually SSH)."""

    def __init__(self, node: Transport, vmid: int) -> None:
        super().__init__()
        self.node = node
        self.vmid = int(vmid)
        self.description = f"CT {self.vmid} via {node.description}"
        self.stats = node.stats
        self.streams = node.streams

    def retarget(self, host: str) -> None:
        """The CT's node is now ``host`` (it migrated)."""
        self.node.retarget(host)
        self.description = f"CT {self.vmid} via {self.node.description}"

    def run(self, argv: list[str], *, input: Input = None, timeout: float | None = None,
            stall: float | None = None, output: Output = None) -> Result:
        result = self.node.run(["pct", "exec", str(self.vmid), "--", *argv], input=input, timeout=timeout,
                               stall=stall, output=output)
        self._check_pct(result)
        return Result(list(argv), result.exit_code, result.stdout, result.stderr)

    def run_agent(self, argv: list[str], *, input: Input = None, timeout: float | None = None,
                  stall: float | None = None, output: Output = None) -> Result:
        """An agent call: through a resident agent (``pct exec … agent serve``) when the node's connection is
        held by the keeper, else as ``run``."""
        result = self.node.run_agent(["pct", "exec", str(self.vmid), "--", *argv], input=input, timeout=timeout,
                                     stall=stall, output=output)
        self._check_pct(result)
        return Result(list(argv), result.exit_code, result.stdout, result.stderr)

    def connect(self) -> None:
        self.node.connect()

    def alive(self) -> bool:
        return self.node.alive()

    def local_port(self) -> int | None:
        return self.node.local_port()

    @property
    def answer_timeout(self) -> float:
        return self.node.answer_timeout

    def open_channel(self, argv: list[str] | None, *, pty: tuple[str, int, int] | None = None) -> Any:
        """``argv`` in the CT on a channel of the node's (None: a login shell there, bash when it has one);
        ``pct exec`` gives it a terminal in the CT when ``pty`` gives one to pct."""
        return self.node.open_channel(["pct", "exec", str(self.vmid), "--", *(argv or ["sh", "-c", LOGIN_SHELL])],
                                      pty=pty)

    def _check_pct(self, result: Result) -> None:
        """A 255 (127: no pct) whose stderr holds one of pct's own messages is pct failing, not the command."""
        if result.exit_code not in (255, 127):
            return
        lines = result.stderr.decode("utf-8", "replace").splitlines()
        for pattern, message, hint in _PCT_FAILURES:
            for line in lines:
                if pattern.search(line) and (result.exit_code == 255 or "pct" in line):
                    fields = {"vmid": self.vmid, "node": self.node.description, "detail": line.strip()}
                    raise TransportError(message.format(**fields), hint=hint.format(**fields))

    def put(self, data: bytes, path: str, mode: int = 0o644) -> None:
        result = self.run(["sh", "-c", PUT_SCRIPT, "sh", path, format(mode, "o")], input=data)
        if not result.ok:
            why = result.tail(3) or f"exit {result.exit_code}"
            raise TransportError(f"cannot write {path} in {self.description}: {why}",
                                 hint="check the permissions and free space inside the CT")

    def close(self) -> None:
        self.node.close()
