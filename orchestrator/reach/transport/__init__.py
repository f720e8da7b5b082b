"""How orch reaches a target: one interface, a local, an SSH and a pct implementation.

A transport runs an argument list (never a shell string) on the target, optionally feeding bytes
on stdin, and returns a ``Result``. Quoting for a remote shell happens in exactly one place,
``ssh.remote_command``, for paramiko and the OpenSSH client (``openssh.py``) alike. Failures to
*reach* the target raise ``TransportError``; a command that ran and exited non-zero is a normal ``Result``.
"""

from __future__ import annotations

from .base import Result, Transport

__all__ = ["Result", "Transport"]
