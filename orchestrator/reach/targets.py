"""Target name or CT id -> how to reach it (local, ssh, proxmox+ssh, proxmox+pct).

``resolve_target`` is pure apart from the Proxmox lookup a ``--ct`` needs; it returns a ``Target``
whose ``connect()`` makes a fresh transport, so a log follower can reconnect after a dropped link.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Callable

from ..config import SLURM_KEYS, Settings, TargetSection
from ..errors import ConfigError, InputError, OrchError, ProxmoxError, TargetError
from .transport.base import Transport


@dataclass
class Target:
    name: str
    spec: TargetSection
    root: str
    checkpoints: str
    python: str
    info: dict = field(default_factory=dict)
    connect: Callable[[], Transport] | None = None
    machine: str = ""
    unasked: Exception | None = None  # a dry run's target that could not be looked up or reached: why

    @property
    def label(self) -> str:
        """How output names the target: ``CT 311 on pvebar``, ``gpu1``, ``local``."""
        if self.spec.kind == "proxmox":
            node = self.info.get("node")
            return f"CT {self.spec.ct}" + (f" on {node}" if node else "")
        if self.spec.kind == "ssh":
            host = self.spec.host or ""
            return host if host == self.name else f"{self.name} ({host})"
        if self.spec.kind == "slurm":
            return f"{self.name} (Slurm at {self.spec.host})"
        return self.name


def _home(path: str | None) -> str | None:
    return os.path.expanduser(path) if path else None


def machine_key(settings: Settings, spec: TargetSection, root: str) -> str:
    """What identifies the machine (and orch root on it) a target reaches, whatever its name.

    Two entries for one CT (``access = "ssh"`` and ``"pct"``) are two ways into one machine.
    """
    if spec.kind == "proxmox":
        cluster = settings.proxmox.host if settings.proxmox else ""
        return f"ct:{spec.ct}@{cluster}:{root}"
    if spec.kind in ("ssh", "slurm"):  # a Slurm target is its login node (and the shared root behind it)
        return f"{spec.kind}:{spec.user or ''}@{spec.host}:{spec.port or 22}:{root}"
    return f"local:{root}"


def paths_for(settings: Settings, spec: TargetSection) -> tuple[str, str]:
    """The target's root and checkpoint folder; ``{project}`` stands for the project's name."""
    root = spec.root or settings.paths.root
    default = settings.paths.checkpoints
    if spec.kind == "slurm" and "checkpoints" not in settings.paths.model_fields_set:
        # on the shared file system: a node-local folder would stay behind on a node the next job may not get
        default = f"{root.rstrip('/')}/checkpoints/{{project}}"
    ckpt = (spec.checkpoints or default).replace("{project}", settings.project.name)
    return root, ckpt


def slurm_options(settings: Settings, spec: TargetSection) -> TargetSection:
    """A Slurm target with ``[slurm]``'s options under its own: each key the target sets itself wins (its
    ``sbatch_args`` replace the table's, a ``resubmit = false`` turns the table's off)."""
    if spec.kind != "slurm":
        return spec
    table = settings.slurm
    inherited = {key: getattr(table, key) for key in SLURM_KEYS
                 if key in table.model_fields_set and key not in spec.model_fields_set}
    return spec.model_copy(update=inherited) if inherited else spec


def planned_target(settings: Settings, name: str, spec: TargetSection) -> "Target":
    """A target as the configuration describes it, before any lookup or connection."""
    spec = slurm_options(settings, spec)
    root, ckpt = paths_for(settings, spec)
    return Target(name, spec, root, ckpt, spec.python, {"kind": spec.kind},
                  machine=machine_key(settings, spec, root))


def target_spec(settings: Settings, name: str | None = None, ct: int | None = None,
                notice: Callable[[str], None] | None = None,
                prefer: str | None = None) -> tuple[str, TargetSection]:
    """Which configured target the flags name (no network).

    Several entries for one CT are ways into the same machine: ``prefer`` (the current target) wins,
    else the first; ``notice`` is told which entries matched and which is used.
    """
    if name and ct is not None:
        raise InputError("give either --target or --ct, not both")
    if ct is not None:
        matches = [(n, t) for n, t in settings.targets.items() if t.kind == "proxmox" and t.ct == ct]
        if matches:
            chosen = next((m for m in matches if m[0] == prefer), matches[0])
            if len(matches) > 1 and notice is not None:
                ways = ", ".join(f"{n} ({t.access})" for n, t in matches)
                notice(f"CT {ct} matches targets {ways}; using {chosen[0]} (pass --target NAME to choose)")
            return chosen
        if settings.proxmox is None:
            raise InputError(f"no target has ct = {ct} and orch.toml has no [proxmox] section",
                             hint="add a [proxmox] section (host, token_id) or a [targets.NAME] with kind = "
                                  "\"proxmox\" and ct = " + str(ct))
        return f"ct{ct}", TargetSection(kind="proxmox", ct=ct)  # the [targets] defaults: ssh as root
    name = name or settings.default_target
    if name not in settings.targets:
        raise InputError(f"unknown target {name!r}", hint="configured targets: " + ", ".join(sorted(settings.targets)))
    if settings.targets[name].kind == "group":  # a command about one target acts on the job's node 0
        name = settings.targets[name].members[0]
    return name, settings.targets[name]


def _ssh_kwargs(settings: Settings) -> dict:
    s = settings.ssh
    kw: dict = {"connect_timeout": s.connect_timeout, "command_timeout": s.command_timeout,
                "keepalive": s.keepalive, "connect_retries": s.connect_retries, "persist": s.persist}
    if s.config_file:
        kw["ssh_config_file"] = _home(s.config_file)
    if s.known_hosts is not None:
        kw["known_hosts_files"] = [_home(p) for p in s.known_hosts]
    if s.trust_file:
        kw["trust_file"] = _home(s.trust_file)
    return kw


def resolve_target(settings: Settings, name: str | None = None, ct: int | None = None, *,
                   trust_new_host: bool = False, start: bool = False,
                   confirm: Callable[[str], bool] | None = None, notice: Callable[[str], None] | None = None,
                   prefer: str | None = None) -> Target:
    target = planned_target(settings, *target_spec(settings, name, ct, notice, prefer))
    tname, spec = target.name, target.spec
    if spec.kind == "local":
        from .transport.local import LocalTransport

        if spec.python == "python3":  # this interpreter: no PATH lookup through version-manager shims
            target.python = sys.executable

        target.connect = LocalTransport
        return target
    ssh_kw = _ssh_kwargs(settings)
    identity = _home(spec.identity_file or settings.ssh.identity_file)
    if spec.kind in ("ssh", "slurm"):  # Slurm: the login node, reached like any SSH host
        host = spec.host or ""
        target.info.update(host=host, port=spec.port, user=spec.user)
        target.connect = lambda: _ssh(host, spec.port, spec.user, identity, trust_new_host, ssh_kw)
        return target
    # proxmox: find the CT through the API (or a lookup of a moment ago), then reach it straight or via its node
    px = settings.proxmox
    if px is None:
        raise InputError(f"target {tname!r} is a Proxmox CT but orch.toml has no [proxmox] section",
                         hint="add [proxmox] host = \"...\" and token_id = \"user@realm!name\"")
    info, seen = _ct_lookup(settings, spec, start, confirm, settings.ssh.connect_timeout)
    target.info.update(ct=info.vmid, node=info.node, name=info.name, access=spec.access,
                       started=info.started, ct_config=info.config_summary)
    if spec.access == "pct":
        from .transport.pct import PctTransport

        node_host = px.node_ssh.host or info.node
        target.info.update(node_ssh=f"{px.node_ssh.user}@{node_host}")
        vmid = info.vmid
        node_kw = dict(ssh_kw, role=f"the Proxmox node {info.node}")
        expect = _expected(settings, spec, info, seen, node_host, target.info, start, confirm,
                           lambda found: px.node_ssh.host or found.node)
        target.connect = lambda: _checked(PctTransport(
            _ssh(expect.address, px.node_ssh.port, px.node_ssh.user, identity, trust_new_host, node_kw), vmid),
            expect)
        return target
    address = spec.address or info.address
    if not address:
        raise TargetError(f"CT {spec.ct} has no address orch can use",
                          hint="set address = \"...\" on the target, or use access = \"pct\"")
    target.info.update(address=address)
    expect = _expected(settings, spec, info, seen, address, target.info, start, confirm,
                       lambda found: spec.address or found.address)
    target.connect = lambda: _checked(
        _ssh(expect.address, spec.port, spec.user or "root", identity, trust_new_host, ssh_kw), expect)
    return target


def _checked(transport: Transport, expect) -> Transport:
    transport.identity = expect  # every agent call on it runs only on the CT the API names
    return transport


def _expected(settings: Settings, spec: TargetSection, info, seen: dict | None, address: str, target_info: dict,
              start: bool, confirm, address_of: Callable):
    """What the machine reached for CT ``spec.ct`` must be (``identity.Expected``): from the API's lookup, and
    the machine id orch saw there before (``seen``: the remembered lookup it came from, None: the API now)."""
    from . import ct_cache
    from .identity import Expected

    px = settings.proxmox
    api, vmid = f"{px.host}:{px.port}", int(spec.ct or 0)

    def again():
        ct_cache.forget(settings.state_dir, api, vmid, spec.access)
        return _look_up(settings, spec, start, confirm)

    return Expected(vmid, info.node, info.hostname, tuple(info.hwaddrs), api, address,
                    machine_id=(seen or {}).get("machine_id"), cached=seen is not None, again=again,
                    saw=lambda machine_id: ct_cache.note(settings.state_dir, api, vmid, spec.access,
                                                         machine_id=machine_id),
                    info=target_info, address_of=address_of)


def _ct_lookup(settings: Settings, spec, start: bool, confirm, connect_timeout: float | None):
    """CT ``spec.ct`` as the API describes it. A running CT's lookup is remembered (``ct_cache``) and reused while
    the port orch reaches it by (the CT's SSH port, or its node's for ``pct``) still answers; one older than
    ``[proxmox] cache_ttl`` is asked again after the command has answered. With it, the remembered lookup it came
    from (None: the API was asked now)."""
    from .. import after_answer
    from . import ct_cache
    from .proxmox import CtInfo

    px = settings.proxmox
    api, vmid = f"{px.host}:{px.port}", int(spec.ct or 0)
    got = ct_cache.lookup(settings.state_dir, api, vmid, spec.access, px.cache_ttl, max_age=px.cache_max_age)
    if got is not None and not (start and spec.access == "pct"):  # the node answers for a stopped CT too
        if spec.access == "pct":
            reach = (px.node_ssh.host or got.get("node"), px.node_ssh.port or 22)
        else:
            reach = (spec.address or got.get("address"), spec.port or 22)
        if _answers(*reach, connect_timeout):
            if got.get("stale"):
                after_answer.later(lambda: _refresh(settings, spec))
            return CtInfo(vmid=vmid, node=got["node"], name=got["name"], status=got["status"],
                          address=got.get("address") or "", config_summary=got.get("config_summary") or {},
                          hwaddrs=tuple(got.get("hwaddrs") or ())), got
    return _look_up(settings, spec, start, confirm), None


def _refresh(settings: Settings, spec) -> None:
    """A stale lookup asked again (after the answer): remembered anew, or forgotten when the API now says no."""
    from . import ct_cache

    try:
        _look_up(settings, spec, False, None)
    except OrchError:
        ct_cache.forget_served()


def _look_up(settings: Settings, spec, start: bool, confirm):
    """CT ``spec.ct`` asked of the API, and remembered (or forgotten, when it is not running)."""
    from . import ct_cache, proxmox

    px = settings.proxmox
    api, vmid = f"{px.host}:{px.port}", int(spec.ct or 0)
    info = proxmox.resolve_ct(proxmox_client(px), vmid, start=start, interactive_confirm=confirm,
                              start_timeout=px.start_timeout, need_address=spec.access == "ssh" and not spec.address)
    ct_cache.remember(settings.state_dir, api, vmid, spec.access, px.cache_ttl,
                      {"node": info.node, "name": info.name, "status": info.status, "address": info.address,
                       "started": info.started, "config_summary": info.config_summary,
                       "hwaddrs": list(info.hwaddrs)}, max_age=px.cache_max_age)
    return info


def _answers(address: str | None, port: int, connect_timeout: float | None) -> bool:
    """Whether something accepts TCP at ``address:port`` (a stopped CT does not: the API then says why)."""
    import socket

    if not address:
        return False
    try:
        socket.create_connection((address, port), timeout=min(1.0, connect_timeout or 1.0)).close()
    except OSError:
        return False
    return True


def check_ct(settings: Settings, vmid: int, notice: Callable[[str], None]) -> dict | None:
    """CT ``vmid`` as the API lists it (node, name, status): a CT that does not exist is refused (NotFoundError).

    When the API cannot be asked (no token here, unreachable, failing), ``notice`` is warned and None returned,
    so a CT can still be chosen offline; a token the API refuses is an error.
    """
    from . import proxmox

    if settings.proxmox is None:
        return None
    try:
        return proxmox.find_ct(proxmox_client(settings.proxmox), vmid)
    except proxmox.ProxmoxApiError as exc:
        if exc.status in (401, 403):
            raise
        why = exc.message
    except (ConfigError, ProxmoxError) as exc:
        why = exc.message
    notice(f"orch: warning: CT {vmid} was not checked ({why})")
    return None


def check_cts(settings: Settings, cts: list[int], notice: Callable[[str], None]) -> None:
    """Each CT ``check_ct`` finds; one that is not running is said through ``notice`` (a launch starts it with
    --start)."""
    for vmid in cts:
        found = check_ct(settings, vmid, notice)
        if found is not None and found.get("status") != "running":
            notice(f"orch: CT {vmid} ({found.get('name') or '?'}) on node {found.get('node')} is "
                   f"{found.get('status')}: a launch starts it with --start")


def proxmox_client(px):
    """The API client a ``[proxmox]`` section describes (token from the environment or its file)."""
    from . import proxmox

    token = proxmox.load_token(px.token_id, token_file=_home(px.token_file))
    return proxmox.ProxmoxClient(px.host, port=px.port, token_id=px.token_id, token_secret=token,
                                 verify_ssl=_home(px.verify_ssl) if isinstance(px.verify_ssl, str)
                                 else px.verify_ssl, timeout=px.timeout)


def _ssh(host: str, port: int | None, user: str | None, identity: str | None, trust: bool, kw: dict) -> Transport:
    """The SSH transport to ``host``: through the connection keeper unless ``[ssh] persist = 0`` (or a new host
    key is to be trusted, which this command's own connection does)."""
    kw = dict(kw)
    persist = kw.pop("persist", 0)
    spec = dict(kw, host=host, port=port, user=user, identity_file=identity)

    def direct() -> Transport:
        from .transport.ssh import SshTransport

        return SshTransport(trust_new_host=trust, **spec)

    if not persist or trust:
        return direct()
    from .keeper.client import KeptTransport

    command_timeout = spec.pop("command_timeout", None)
    return KeptTransport(spec, command_timeout=command_timeout, persist=persist, direct=direct)
