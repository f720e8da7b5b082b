"""Proxmox VE: turn a CT id into a node, a running container and an address.

The only module that imports proxmoxer and requests, and it does so lazily, so ``orch --help``
never pays for them. Every failure of either library is translated here into ``ProxmoxError``
(or ``ConfigError`` for a missing or unsafe token) with a hint; the token secret never appears
in a message, a hint or a repr.

    client = ProxmoxClient("pve.lan", token_id="root@pam!orch", token_secret=load_token("root@pam!orch"))
    ct = resolve_ct(client, 200, start=True)        # CtInfo(vmid=200, node="pve1", address="10.0.0.5", ...)
"""

from __future__ import annotations

import ipaddress
import os
import re
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError, CtNotRunning, InputError, NotFoundError, ProxmoxError, TargetError

TOKEN_ENV = "ORCH_PROXMOX_TOKEN"
GPU_DEVICE_PREFIXES = ("/dev/nvidia", "/dev/dri", "/dev/kfd", "/dev/accel")
GPU_CHAR_MAJORS = {"195": "nvidia", "226": "dri"}
_PERMISSION = re.compile(r"Permission check failed \((?P<path>[^,]+), (?P<priv>[^)]+)\)")
_TASK_OK = re.compile(r"OK|WARNINGS: \d+")


def _token_hint(token_id: str) -> str:
    user, _, name = token_id.partition("!")
    return (
        f"create the token on a node: `pveum user token add {user} {name or 'orch'} --privsep 1`, give it "
        "VM.Audit (and VM.PowerMgmt for --start): `pveum role add OrchDeploy --privs \"VM.Audit VM.PowerMgmt\"` "
        f"and `pveum acl modify /vms --tokens '{token_id}' --roles OrchDeploy`; then export {TOKEN_ENV}=<secret> "
        "or write the secret to a file with mode 0600 named by [proxmox] token_file"
    )


def load_token(token_id: str, *, env: Mapping[str, str] = os.environ, token_file: str | None = None) -> str:
    """The API token secret: ``ORCH_PROXMOX_TOKEN`` first, else ``token_file`` (mode 0600 or stricter)."""
    secret = env.get(TOKEN_ENV, "").strip()
    if secret:
        return secret
    if not token_file:
        raise ConfigError(f"no Proxmox API token secret for {token_id}: {TOKEN_ENV} is not set "
                          "and no token_file is configured", _token_hint(token_id))
    path = os.path.expanduser(token_file)
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
        if mode & 0o077:
            raise ConfigError(f"token file {path} is readable by other users (mode {mode:04o})", f"chmod 600 {path}")
        with open(path, encoding="utf-8") as fh:
            secret = fh.read().strip()
    except FileNotFoundError:
        raise ConfigError(f"token file {path} does not exist", _token_hint(token_id)) from None
    except OSError as exc:
        raise ConfigError(f"cannot read token file {path}: {exc.strerror}",
                          f"check the permissions of {path}") from None
    if not secret:
        raise ConfigError(f"token file {path} is empty", _token_hint(token_id))
    return secret


class ProxmoxApiError(ProxmoxError):
    """The API answered with an error status (``status``: 400, 401, 403, 500, 595, ...)."""

    def __init__(self, message: str, hint: str | None, status: int) -> None:
        super().__init__(message, hint)
        self.status = status


class ProxmoxClient:
    """A token-authenticated Proxmox VE API client whose every failure is a ``ProxmoxError``.

    ``verify_ssl`` is True (system CAs), a path to a CA/cert file (the node's
    ``/etc/pve/pve-root-ca.pem``), or False. ``timeout`` bounds each request in seconds.
    """

    def __init__(self, host: str, port: int = 8006, *, token_id: str, token_secret: str,
                 verify_ssl: bool | str = True, timeout: float = 10.0) -> None:
        user, sep, name = token_id.partition("!")
        if not sep or "@" not in user or not name:
            raise ConfigError(f"token id {token_id!r} is not of the form USER@REALM!TOKENNAME",
                              "copy the full token id from `pveum user token list USER`, e.g. root@pam!orch")
        self.host, self.port, self.token_id = host, port, token_id
        self.verify_ssl, self.timeout = verify_ssl, timeout
        self._secret = token_secret
        self._api: Any = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 address
        return f"https://{host}:{self.port}"

    def __repr__(self) -> str:
        return f"ProxmoxClient({self.url}, token_id={self.token_id!r})"

    def _connect(self) -> Any:
        if self._api is None:
            from proxmoxer import ProxmoxAPI

            user, _, name = self.token_id.partition("!")
            self._api = ProxmoxAPI(self.host, port=self.port, user=user, token_name=name, token_value=self._secret,
                                   verify_ssl=self.verify_ssl, timeout=self.timeout, backend="https")
        return self._api

    def get(self, *path: str | int, **params: Any) -> Any:
        """``GET /api2/json/<path>`` and return ``data``: ``client.get("nodes", "pve1", "lxc", 200, "config")``."""
        return self._call("GET", path, params)

    def post(self, *path: str | int, **data: Any) -> Any:
        """``POST /api2/json/<path>`` with form ``data``; returns ``data`` (often a task UPID)."""
        return self._call("POST", path, data)

    def _call(self, method: str, path: tuple[str | int, ...], args: dict[str, Any]) -> Any:
        import requests
        from proxmoxer.core import ResourceException

        where = "/" + "/".join(str(p) for p in path)
        try:
            resource = self._connect()(list(str(p) for p in path))
            return resource.get(**args) if method == "GET" else resource.post(**args)
        except ResourceException as exc:
            error = self._api_error(exc.status_code, str(exc.content or exc.status_message), exc.errors, where)
        except requests.exceptions.SSLError as exc:
            reason = re.search(r"certificate verify failed: ([^(]+)", str(exc))
            error = ProxmoxError(
                f"TLS verification of the Proxmox API at {self.url} failed"
                + (f": {reason.group(1).strip()}" if reason else ""),
                "copy the node's /etc/pve/pve-root-ca.pem here and set "
                "[proxmox] verify_ssl = \"/path/to/pve-root-ca.pem\" (better than verify_ssl = false, "
                "which lets anyone in the middle read the token)",
            )
        except requests.exceptions.Timeout:
            error = ProxmoxError(f"the Proxmox API at {self.url} did not answer {method} {where} "
                                 f"within {self.timeout:g} s",
                                 "check that the node is up and reachable, or raise [proxmox] timeout")
        except requests.exceptions.ConnectionError as exc:
            refused = "refused" in str(exc).lower()
            error = ProxmoxError(f"cannot connect to the Proxmox API at {self.url}"
                                 + (" (connection refused)" if refused else ""),
                                 "check [proxmox] host and port (the API listens on 8006) and that pveproxy runs")
        except requests.exceptions.RequestException as exc:
            error = ProxmoxError(f"request to the Proxmox API at {self.url} failed: {type(exc).__name__}",
                                 "check [proxmox] host and port")
        except ValueError as exc:
            error = ProxmoxError(f"the Proxmox API at {self.url} sent an unreadable answer to {where}: {exc}",
                                 "check that [proxmox] host and port point at a Proxmox VE API")
        raise self._redacted(error) from None

    def _api_error(self, status: int, reason: str, errors: Any, where: str) -> ProxmoxApiError:
        if status == 401:
            return ProxmoxApiError(
                f"the Proxmox API at {self.url} rejected token {self.token_id} (401 {reason})",
                f"check {TOKEN_ENV} (or the token file) holds this token's secret and that the token id is right: "
                f"`pveum user token list {self.token_id.partition('!')[0]}`", 401)
        if status == 403:
            match = _PERMISSION.search(reason)
            hint = (f"the token lacks {match['priv']} on {match['path']}: `pveum acl modify {match['path']} "
                    f"--tokens '{self.token_id}' --roles <a role with {match['priv']}>`"
                    if match else "grant the token the privilege it needs: `pveum acl list`")
            return ProxmoxApiError(f"Proxmox refused {where}: {reason}", hint, 403)
        if status == 595:
            return ProxmoxApiError(f"Proxmox node unreachable for {where} (595 {reason})",
                                   "the node is offline or cut off from the cluster: check `pvecm status`", 595)
        if status == 596:
            return ProxmoxApiError(f"Proxmox could not reach a node for {where} (596 {reason})",
                                   "node names are cluster node names (see `pvecm nodes`), not host names", 596)
        detail = ""
        if isinstance(errors, dict) and errors:
            detail = " (" + ", ".join(f"{k}: {v}" for k, v in errors.items()) + ")"
        hint = ("the CT may have moved to another node or been removed; check `pct list` on the nodes"
                if "does not exist" in reason else "see the node's pveproxy log (journalctl -u pveproxy) for details")
        return ProxmoxApiError(f"Proxmox API error on {where}: {status} {reason}{detail}", hint, status)

    def _redacted(self, error: ProxmoxError) -> ProxmoxError:
        if len(self._secret) >= 8:
            error.message = error.message.replace(self._secret, "***")
            error.args = (error.message,)
            if error.hint:
                error.hint = error.hint.replace(self._secret, "***")
        return error


@dataclass(frozen=True)
class CtInfo:
    """A resolved container: where it lives, how to reach it, and what it is made of."""

    vmid: int
    node: str
    name: str
    status: str
    address: str
    started: bool = False
    lock: str | None = None
    config_summary: dict[str, Any] = field(default_factory=dict)
    hwaddrs: tuple[str, ...] = ()  # the MAC addresses of its netN: what the machine answering must have

    @property
    def hostname(self) -> str:
        """The hostname the CT's config gives it (Proxmox writes it into the CT at each start)."""
        return str(self.config_summary.get("hostname") or self.name)


def resolve_ct(
    client: ProxmoxClient,
    vmid: int,
    *,
    start: bool = False,
    interactive_confirm: Callable[[str], bool] | None = None,
    start_timeout: float = 60.0,
    address_timeout: float = 20.0,
    poll_interval: float = 0.5,
    need_address: bool = True,
) -> CtInfo:
    """Find CT ``vmid``'s node, start it if allowed, and find an address to reach it at.

    A stopped CT is started only with ``start=True`` or when ``interactive_confirm(question)``
    says yes. After a start, the address is polled for up to ``address_timeout`` s (DHCP lags).
    """
    entry = find_ct(client, vmid)
    node = entry["node"]
    status = client.get("nodes", node, "lxc", vmid, "status", "current")
    name = str(status.get("name") or entry.get("name") or f"CT{vmid}")
    started = False
    if status.get("status") != "running":
        question = f"CT {vmid} ({name}) on node {node} is {status.get('status', 'not running')}. Start it?"
        if not (start or (interactive_confirm is not None and interactive_confirm(question))):
            raise CtNotRunning(f"CT {vmid} is {status.get('status', 'not running')}",
                              f"a launch starts it with --start (orch deploy --start), or start it yourself: "
                              f"`pct start {vmid}` on node {node}")
        status = _start(client, node, vmid, start_timeout, poll_interval)
        started = True
    config = client.get("nodes", node, "lxc", vmid, "config") or {}
    static = static_address(config)
    wait = address_timeout if (started or static is None) else 0.0
    if not need_address:  # reached through its node with pct: no address needed
        wait = 0.0
    address = _live_address(client, node, vmid, wait, poll_interval) or static
    if address is None and need_address:
        raise TargetError(f"CT {vmid} on node {node} has no usable address (only loopback or link-local)",
                          "give net0 a static ip= (`pct set ... --net0 ...,ip=10.0.0.5/24`), check that DHCP answers, "
                          "or set address = \"...\" in the target's section of orch.toml")
    return CtInfo(vmid=vmid, node=node, name=name, status=str(status.get("status")), address=address,
                  started=started, lock=status.get("lock"), config_summary=config_summary(config),
                  hwaddrs=hwaddrs(config))


def hwaddrs(config: Mapping[str, Any]) -> tuple[str, ...]:
    """The MAC addresses of a CT's ``netN`` (Proxmox gives a clone new ones), lower case."""
    nets = sorted((k for k in config if re.fullmatch(r"net\d+", k)), key=lambda k: int(k[3:]))
    found = (parse_prop_string(config[k]).get("hwaddr", "").lower() for k in nets)
    return tuple(a for a in found if a)


def find_ct(client: ProxmoxClient, vmid: int) -> dict[str, Any]:
    """CT ``vmid``'s entry in ``/cluster/resources`` (node, name, status); a CT the token cannot see is not found."""
    resources = client.get("cluster", "resources", type="vm") or []
    for entry in resources:
        if entry.get("type") == "lxc" and int(entry.get("vmid", -1)) == vmid:
            return entry
    if any(e.get("type") == "qemu" and int(e.get("vmid", -1)) == vmid for e in resources):
        raise InputError(f"{vmid} is a QEMU virtual machine, not an LXC container",
                           "orch deploys into LXC containers; pick a CT id from `pct list`")
    seen = "the token sees no guests at all" if not resources else f"the token sees {len(resources)} guest(s)"
    raise NotFoundError(
        f"CT {vmid} not found on the Proxmox cluster at {client.url} ({seen})",
        f"a token with privilege separation sees only what its ACLs allow, and lists hide the rest without an "
        f"error: check `pveum acl list` and grant {client.token_id} VM.Audit on /vms/{vmid} "
        f"(VM.PowerMgmt too for --start); or check the CT id with `pct list`",
    )


def _start(client: ProxmoxClient, node: str, vmid: int, timeout: float, poll: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    upid = client.post("nodes", node, "lxc", vmid, "status", "start")
    wait_task(client, node, upid, deadline=deadline, poll_interval=poll, what=f"starting CT {vmid}")
    while True:
        status = client.get("nodes", node, "lxc", vmid, "status", "current")
        if status.get("status") == "running":
            return status
        if time.monotonic() >= deadline:
            raise ProxmoxError(f"CT {vmid} is still {status.get('status')} {timeout:g} s after its start task ended",
                               f"check the container on node {node}: `pct status {vmid}`; "
                               f"`pct start {vmid} --debug` shows why")
        time.sleep(poll)


def wait_task(client: ProxmoxClient, node: str, upid: str, *, deadline: float, poll_interval: float = 0.5,
              what: str = "the task") -> str:
    """Poll task ``upid`` until it stops; return its exitstatus if that is ``OK`` or ``WARNINGS: N``.

    A 400 just after the task was created (the node has not registered it yet) is retried.
    """
    while True:
        try:
            task = client.get("nodes", node, "tasks", upid, "status")
        except ProxmoxApiError as exc:
            if exc.status != 400 or time.monotonic() >= deadline:
                raise
            task = {}
        if task.get("status") == "stopped":
            exitstatus = str(task.get("exitstatus", ""))
            if _TASK_OK.fullmatch(exitstatus):
                return exitstatus
            raise ProxmoxError(f"{what} failed on node {node}: {exitstatus or 'no exit status'}",
                               f"see the task log: `pvenode task log {upid}` on node {node}")
        if time.monotonic() >= deadline:
            raise ProxmoxError(f"{what} did not finish in time (task {upid} still running)",
                               f"see `pvenode task log {upid}` on node {node}, or raise [proxmox] start_timeout")
        time.sleep(poll_interval)


def _live_address(client: ProxmoxClient, node: str, vmid: int, wait: float, poll: float) -> str | None:
    deadline = time.monotonic() + wait
    while True:
        try:
            interfaces = client.get("nodes", node, "lxc", vmid, "interfaces")
        except ProxmoxApiError as exc:
            if exc.status == 501:
                return None
            raise
        address = pick_address(interfaces or [])
        if address is not None or time.monotonic() >= deadline:
            return address
        time.sleep(poll)


def pick_address(interfaces: list[dict[str, Any]]) -> str | None:
    """The best address of ``/interfaces``: not lo, not loopback or link-local; IPv4 before IPv6."""
    found: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = []
    for iface in interfaces:
        if iface.get("name") == "lo":
            continue
        texts = [a.get("ip-address", "") for a in iface.get("ip-addresses") or []]
        if not texts:
            texts = [str(iface.get(k, "")).split("/")[0] for k in ("inet", "inet6")]
        for text in texts:
            try:
                ip = ipaddress.ip_address(text)
            except ValueError:
                continue
            if not (ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast):
                found.append(ip)
    found.sort(key=lambda ip: ip.version)
    return str(found[0]) if found else None


def parse_prop_string(value: str, default_key: str | None = None) -> dict[str, str]:
    """``"name=eth0,ip=10.0.0.5/24"`` -> dict; a bare first item goes to ``default_key``."""
    out: dict[str, str] = {}
    for item in str(value).split(","):
        key, sep, val = item.partition("=")
        if sep:
            out[key.strip()] = val.strip()
        elif item.strip() and default_key:
            out[default_key] = item.strip()
    return out


def static_address(config: Mapping[str, Any]) -> str | None:
    """The static IPv4 (then IPv6) of ``net0``/``net1``/...; ``dhcp``/``manual`` are not addresses."""
    nets = sorted((k for k in config if re.fullmatch(r"net\d+", k)), key=lambda k: int(k[3:]))
    for key in ("ip", "ip6"):
        for net in nets:
            value = parse_prop_string(config[net]).get(key, "")
            try:
                ip = ipaddress.ip_interface(value).ip
            except ValueError:
                continue
            if not (ip.is_loopback or ip.is_link_local):
                return str(ip)
    return None


def config_summary(config: Mapping[str, Any]) -> dict[str, Any]:
    """What an experiment record keeps of a CT's config: size, mounts, devices, raw lxc lines, GPUs.

    Values of ``lxc.environment`` are blanked, and ``description``/``env`` are left out, since
    people put secrets there.
    """
    mounts, devices = _numbered(config, "mp"), _numbered(config, "dev")
    raw = []
    for pair in config.get("lxc") or []:
        key, value = (pair[0], pair[1]) if isinstance(pair, (list, tuple)) and len(pair) == 2 else (str(pair), "")
        if key == "lxc.environment":
            value = value.split("=", 1)[0] + "=<redacted>"
        raw.append(f"{key}: {value}")
    return {
        "hostname": config.get("hostname"),
        "cores": config.get("cores"),
        "memory": config.get("memory"),
        "swap": config.get("swap"),
        "unprivileged": bool(int(config.get("unprivileged", 0) or 0)),
        "rootfs": config.get("rootfs"),
        "mounts": mounts,
        "devices": devices,
        "lxc": raw,
        "gpus": _gpus(devices, mounts, raw),
    }


def _numbered(config: Mapping[str, Any], prefix: str) -> dict[str, str]:
    keys = [k for k in config if re.fullmatch(prefix + r"\d+", k)]
    return {k: str(config[k]) for k in sorted(keys, key=lambda k: int(k[len(prefix):]))}


def _gpus(devices: dict[str, str], mounts: dict[str, str], raw: list[str]) -> list[str]:
    found: list[str] = []
    for value in devices.values():
        path = parse_prop_string(value, "path").get("path", "")
        if path.startswith(GPU_DEVICE_PREFIXES):
            found.append(path)
    for value in mounts.values():
        source = parse_prop_string(value, "volume").get("volume", "")
        if source.startswith(GPU_DEVICE_PREFIXES):
            found.append(source)
    for line in raw:
        key, _, value = line.partition(": ")
        if key == "lxc.mount.entry" and value.split(" ")[0].startswith(GPU_DEVICE_PREFIXES):
            found.append(value.split(" ")[0])
        rule = re.fullmatch(r"[cb] (\d+):\S+ \S+", value.strip())
        if key.endswith("devices.allow") and rule and rule[1] in GPU_CHAR_MAJORS:
            found.append(line)
    return list(dict.fromkeys(found))


def gpu_count(gpus: list[str]) -> int | None:
    """How many GPUs a CT config passes through: ``/dev/nvidiaN`` (else ``/dev/dri/renderDN``) devices.

    Control nodes (``/dev/nvidiactl``, ``/dev/nvidia-uvm``) are not GPUs. A config that grants GPU access
    without naming a numbered device (only ``c 195:* rwm``, or all of ``/dev/dri``) counts ``None``: some, unknown.
    """
    nvidia = {g for g in gpus if re.fullmatch(r"/dev/nvidia\d+", g)}
    render = {g for g in gpus if re.fullmatch(r"/dev/dri/renderD\d+", g)}
    if nvidia or render:
        return len(nvidia) or len(render)
    return None if gpus else 0


def list_cts(client: ProxmoxClient, summaries: bool = False) -> list[dict[str, Any]]:
    """Every LXC container the token can see: id, name, node, status, address and passed-through GPUs
    (with ``summaries``, each config's ``config_summary`` too).

    A CT whose node does not answer is listed with what ``/cluster/resources`` says, and ``error``.
    """
    out = []
    for entry in client.get("cluster", "resources", type="vm") or []:
        if entry.get("type") != "lxc":
            continue
        vmid, node = int(entry["vmid"]), str(entry.get("node", ""))
        row: dict[str, Any] = {"ct": vmid, "name": entry.get("name") or f"CT{vmid}", "node": node,
                               "status": entry.get("status"), "address": None, "gpus": None, "gpu_devices": []}
        try:
            config = client.get("nodes", node, "lxc", vmid, "config") or {}
            summary = config_summary(config)
            gpus = summary["gpus"]
            live = _live_address(client, node, vmid, 0.0, 0.0) if row["status"] == "running" else None
            row.update(address=live or static_address(config), gpus=gpu_count(gpus), gpu_devices=gpus)
            if summaries:
                row["config_summary"] = summary
        except ProxmoxError as exc:
            row["error"] = exc.message
        out.append(row)
    return sorted(out, key=lambda r: r["ct"])
