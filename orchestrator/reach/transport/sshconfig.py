"""One SSH hop as the SSH config describes it, and its paramiko client.

The config is the one file ``[ssh] config_file`` names, else the user's ``~/.ssh/config`` then the system's
``/etc/ssh/ssh_config`` (for each option the first value found wins, as with OpenSSH), with its ``Include``
lines expanded here, read by paramiko's own parser. A hop resolves as OpenSSH does: ``HostName``, then ``User`` (else the local user), ``Port`` (else 22),
``IdentityFile`` and ``ConnectTimeout``; a user or port given to orch wins.

Nothing here imports fabric: a hop needs only what paramiko reads, and fabric with invoke costs
every process that connects, about 0.15 s here (``sshlib``: paramiko itself loads without invoke until a ``Match exec`` needs it).
"""

from __future__ import annotations

import getpass
import glob
import io
import os
import re
import shlex
from typing import Any, Callable

from ...errors import InputError
from . import sshlib

USER_CONFIG = "~/.ssh/config"
SYSTEM_CONFIG = "/etc/ssh/ssh_config"


def load(path: str | None) -> Any:
    """A paramiko ``SSHConfig`` of ``path`` (which must exist), else of the user's and the system's files."""
    config = sshlib.paramiko().SSHConfig()
    if path is not None:
        path = os.path.expanduser(path)
        if not os.path.exists(path):
            raise InputError(f"SSH config file {path} does not exist",
                             hint="fix the path or leave it unset to use ~/.ssh/config")
        files = [path]
    else:
        files = [f for f in (os.path.expanduser(USER_CONFIG), SYSTEM_CONFIG) if os.path.isfile(f)]
    for name in files:
        base = os.path.dirname(SYSTEM_CONFIG) if name == SYSTEM_CONFIG else os.path.expanduser("~/.ssh")
        config.parse(io.StringIO(expanded(name, base)))
    return config


_INCLUDE = re.compile(r"^\s*include(?:\s*=\s*|\s+)(.*?)\s*$", re.I)
_BLOCK = re.compile(r"^\s*(?:host|match)(?:\s*=\s*|\s+)", re.I)
INCLUDE_DEPTH = 16  # OpenSSH's own limit on nested Include


def expanded(path: str, base: str, depth: int = 0) -> str:
    """The text of the SSH config at ``path`` with each ``Include`` replaced by the files it names, as OpenSSH
    reads them (paramiko's parser knows no ``Include``): globs in name order, ``~`` expanded, a relative path under
    ``base`` (``~/.ssh``, or ``/etc/ssh`` for the system file), a pattern that matches nothing skipped. The block an
    ``Include`` sits in (``Host``/``Match``, else every host) goes on after the included lines, which is how OpenSSH
    scopes the ``Host`` lines inside an included file; a file with blocks of its own included inside a block (which
    OpenSSH reads as both conditions at once) is refused, naming it."""
    if depth > INCLUDE_DEPTH:
        raise InputError(f"the SSH config {path} is included more than {INCLUDE_DEPTH} deep (an Include loop?)",
                         hint="fix the Include lines of the SSH config")
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError as exc:
        raise InputError(f"cannot read the SSH config file {path}: {exc.strerror}",
                         hint="fix its permissions, or name another with [ssh] config_file") from None
    out: list[str] = []
    block = "Host *"
    for line in lines:
        found = _INCLUDE.match(line)
        if found is None:
            if _BLOCK.match(line):
                block = line
            out.append(line)
            continue
        try:
            patterns = shlex.split(found.group(1), comments=True)
        except ValueError:
            raise InputError(f"the SSH config {path}: cannot read the line {line.strip()!r}",
                             hint="fix its quotes") from None
        for pattern in patterns:
            pattern = os.path.join(base, os.path.expanduser(pattern))  # an absolute pattern stays as it is
            for name in sorted(glob.glob(pattern)):
                if not os.path.isfile(name):
                    continue
                text = expanded(name, base, depth + 1)
                if block != "Host *" and any(_BLOCK.match(inner) for inner in text.splitlines()):
                    raise InputError(f"the SSH config {path} includes {name} inside `{block.strip()}`, and that "
                                     "file has Host or Match blocks of its own, which orch cannot scope as ssh "
                                     "does", hint="move that Include line to the top level of the SSH config")
                out.append(text)
        out.append(block)
    return "\n".join(out) + "\n"


def lookup(config: Any) -> Callable[[str], dict]:
    """``config``'s settings for a host alias, a ``Match exec`` that cannot run said as an input error."""

    def settings(alias: str) -> dict:
        try:
            return dict(config.lookup(alias))
        except ImportError:  # a Match exec line: paramiko runs it through invoke, loaded only now
            pass
        if not sshlib.with_invoke():
            raise InputError(f"the SSH config uses `Match exec` for {alias}, which paramiko runs through the invoke "
                             "package, and it is not installed", hint="install it beside orch (pip install invoke), "
                                                                      "or drop the Match exec block for this host")
        return dict(config.lookup(alias))

    return settings


class Connection:
    """One hop: where the SSH config says ``alias`` (a bare host: ``split_host``) is, the arguments for
    ``SSHClient.connect`` (``connect_kwargs``: key files, timeouts, the socket), and once ``open``, its client and
    transport."""

    def __init__(self, alias: str, settings: Callable[[str], dict], *, user: str | None = None,
                 port: int | None = None) -> None:
        found = settings(alias)
        self.host: str = found.get("hostname") or alias
        self.user: str = user or found.get("user") or getpass.getuser()
        self.port: int = int(port or found.get("port") or 22)
        timeout = found.get("connecttimeout")
        self.connect_timeout: float | None = float(timeout) if timeout not in (None, "") else None
        keys = found.get("identityfile") or []
        self.connect_kwargs: dict[str, Any] = {"key_filename": list(keys)} if keys else {}
        self.client = sshlib.paramiko().SSHClient()  # its host-key policy is orch's (hostkeys.install), set before open
        self.transport: Any = None

    def open(self) -> None:
        kwargs = dict(self.connect_kwargs, hostname=self.host, port=self.port, username=self.user)
        if not kwargs.get("key_filename"):
            kwargs.pop("key_filename", None)
        self.client.connect(**kwargs)
        self.transport = self.client.get_transport()

    def close(self) -> None:
        """The connection closed, a half-open one too (its handshake or login failed): no thread is left."""
        self.client.close()


def split_host(host: str, user: str | None, port: int | None) -> tuple[str, str | None, int | None]:
    """(host, user, port) of a host given as ``user@host:port``, split as ssh reads it (one colon only: an IPv6
    address keeps its own), before the SSH config is asked about the host; a user or port named twice is an input
    error."""
    where = host
    if "@" in host:
        named, host = host.rsplit("@", 1)
        if user is not None and user != named:
            raise InputError(f"{where}: the user is named twice ({named} and {user})",
                             hint="give the user once, in user = or in host =")
        user = named
    if host.count(":") == 1:
        host, text = host.split(":")
        try:
            named_port = int(text)
        except ValueError:
            raise InputError(f"{where}: {text!r} is not a port number", hint="write host = \"name\" and port = N")
        if port is not None and int(port) != named_port:
            raise InputError(f"{where}: the port is named twice ({named_port} and {port})",
                             hint="give the port once, in port = or in host =")
        port = named_port
    return host, user, port
