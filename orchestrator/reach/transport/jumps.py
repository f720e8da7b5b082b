"""The way to an SSH host through its jump hosts, planned from the SSH config without touching the network.

OpenSSH's ``ProxyJump a,b`` means: connect to ``a`` (itself reached the way ``a``'s own config says),
then to ``b`` through ``a``, then to the destination through ``b``. ``plan_route`` turns that into a
``Route``, first hop first, so that the SSH transport can open every hop itself with the same strict
host-key policy. A ``ProxyCommand`` is an external program: it only ever reaches the first hop.

    >>> cfg = {"gpu": {"proxyjump": "root@bastion:2222"}, "bastion": {}}
    >>> plan_route("gpu", lambda alias: cfg.get(alias, {})).hops
    [Hop(alias='bastion', user='root', port=2222)]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ...errors import InputError

MAX_JUMPS = 8

Lookup = Callable[[str], Mapping[str, Any]]


@dataclass(frozen=True)
class Hop:
    """One jump host as written in ``ProxyJump``; ``alias`` is looked up in the SSH config like any host."""

    alias: str
    user: str | None = None
    port: int | None = None


@dataclass(frozen=True)
class Route:
    """Jump hosts to pass through before the destination, first first; ``proxy_command`` reaches the first
    of them (or the destination when there are none)."""

    hops: list[Hop] = field(default_factory=list)
    proxy_command: str | None = None


def parse_hop(text: str) -> Hop:
    """``[user@]host[:port]``, ``[user@][v6addr]:port`` or ``ssh://[user@]host[:port]``."""
    spec = text.strip()
    if spec.startswith("ssh://"):
        spec = spec[len("ssh://"):].rstrip("/")
    user, _, hostport = spec.rpartition("@")
    host, port = hostport, None
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else None
    elif hostport.count(":") == 1:
        host, port = hostport.split(":")
    if not host or (port is not None and not port.isdigit()):
        raise InputError(f"cannot read the jump host {text.strip()!r} in ProxyJump",
                         hint="write it as [user@]host[:port], several separated by commas")
    return Hop(host, user or None, int(port) if port else None)


def parse_proxy_jump(value: str | None) -> list[Hop]:
    """The hops of a ``ProxyJump`` value, first first; ``none`` (or nothing) means no jump host."""
    if not value or value.strip().lower() == "none":
        return []
    return [parse_hop(part) for part in value.split(",")]


def plan_route(alias: str, lookup: Lookup) -> Route:
    """How to reach ``alias``: its ``ProxyJump`` hops, preceded by the way to the first of them.

    A host whose ``ProxyJump`` names itself (``Host *`` blocks) is reached directly, not through itself; a
    longer loop, or more than ``MAX_JUMPS`` hops, is an input error.
    """
    return _route(alias, lookup, (alias,))


def _route(alias: str, lookup: Lookup, seen: tuple[str, ...]) -> Route:
    config = lookup(alias)
    hops = [hop for hop in parse_proxy_jump(config.get("proxyjump")) if hop.alias != alias]
    if not hops:
        if config.get("proxyjump"):  # ProxyJump given (even "none" or only itself): ProxyCommand is ignored
            return Route()
        command = config.get("proxycommand")
        return Route(proxy_command=command if command and command.strip().lower() != "none" else None)
    first = hops[0].alias
    if first in seen:
        raise InputError(f"ProxyJump loops: {' -> '.join([*seen, first])}",
                         hint="fix the ProxyJump lines in the SSH config (a Host * block may need !host)")
    before = _route(first, lookup, (*seen, first))
    route = Route([*before.hops, *hops], before.proxy_command)
    if len(route.hops) > MAX_JUMPS:
        raise InputError(f"more than {MAX_JUMPS} jump hosts on the way to {seen[0]}",
                         hint="check the ProxyJump lines in the SSH config for a loop")
    return route


def describe_jump(alias: str, host: str, port: int) -> str:
    """How errors name a jump host: ``the jump host bastion (10.0.0.5:22)``."""
    where = f"{host}:{port}"
    return f"the jump host {alias} ({where})" if alias != host else f"the jump host {where}"
