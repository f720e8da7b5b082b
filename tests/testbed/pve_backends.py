"""Where the Proxmox API stand-in gets its containers from.

A backend answers for the LXC containers of one node: which vmids exist, whether each runs, its
pct.conf keys and its live interfaces. ``MemoryBackend`` keeps them in memory for unit tests;
``LxcBackend`` reads real LXC containers named by vmid, so the stand-in reports what is actually
running on the testbed and cannot drift from it.

    backend = MemoryBackend([MemoryCt(200, name="ct200", ipv4="10.77.0.200/24")])
    backend = LxcBackend()                      # every /var/lib/lxc/<digits>/config
"""

from __future__ import annotations

import abc
import ipaddress
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class BackendError(Exception):
    """A start or stop failed; the message becomes the task's exitstatus."""


def interface(name: str, hwaddr: str, addresses: list[str]) -> dict[str, Any]:
    """One entry of ``GET /nodes/{node}/lxc/{vmid}/interfaces`` in the real shape.

    ``addresses`` are ``"ip/prefix"`` strings; ``inet``/``inet6`` hold only the last one of each
    family, as pve-container does.
    """
    entry: dict[str, Any] = {"name": name, "hwaddr": hwaddr, "hardware-address": hwaddr, "ip-addresses": []}
    for text in addresses:
        iface = ipaddress.ip_interface(text)
        family = "inet" if iface.version == 4 else "inet6"
        entry["ip-addresses"].append(
            {"ip-address": str(iface.ip), "ip-address-type": family, "prefix": iface.network.prefixlen}
        )
        entry[family] = f"{iface.ip}/{iface.network.prefixlen}"
    return entry


def link_local_for(hwaddr: str) -> str:
    """The EUI-64 fe80:: address a kernel gives an interface with this MAC."""
    octets = [int(part, 16) for part in hwaddr.split(":")]
    octets[0] ^= 0x02
    eui = octets[:3] + [0xFF, 0xFE] + octets[3:]
    groups = [f"{eui[i] << 8 | eui[i + 1]:x}" for i in range(0, 8, 2)]
    return f"fe80::{':'.join(groups)}/64"


LOOPBACK = interface("lo", "00:00:00:00:00:00", ["127.0.0.1/8", "::1/128"])


class Backend(abc.ABC):
    """The containers of one node, as the stand-in needs them."""

    @abc.abstractmethod
    def vmids(self) -> list[int]:
        """All container ids, sorted."""

    @abc.abstractmethod
    def status(self, vmid: int) -> str:
        """``"running"`` or ``"stopped"``; ``KeyError`` for an unknown vmid."""

    @abc.abstractmethod
    def start(self, vmid: int) -> None:
        """Start the container; ``BackendError`` when it does not come up."""

    @abc.abstractmethod
    def stop(self, vmid: int) -> None:
        """Stop the container at once (``pct stop`` semantics)."""

    @abc.abstractmethod
    def config(self, vmid: int) -> dict[str, Any]:
        """pct.conf keys (``net0``, ``hostname``, ``cores``, ``mp0``, ``lxc``, ...) without ``digest``."""

    @abc.abstractmethod
    def interfaces(self, vmid: int) -> list[dict[str, Any]]:
        """Live interfaces including ``lo``; only called while the container runs."""

    def name(self, vmid: int) -> str:
        return str(self.config(vmid).get("hostname", f"CT{vmid}"))


@dataclass
class MemoryCt:
    """A container that exists only in memory; ``addresses`` are what eth0 gets once running."""

    vmid: int
    name: str = ""
    running: bool = True
    addresses: list[str] = field(default_factory=list)
    hwaddr: str = ""
    config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.name = self.name or f"ct{self.vmid}"
        self.hwaddr = self.hwaddr or f"BC:24:11:00:{self.vmid // 256 % 256:02X}:{self.vmid % 256:02X}"
        self.config = {
            "arch": "amd64",
            "hostname": self.name,
            "cores": 2,
            "memory": 2048,
            "swap": 512,
            "ostype": "debian",
            "rootfs": f"local-lvm:vm-{self.vmid}-disk-0,size=8G",
            "unprivileged": 1,
            "net0": f"name=eth0,bridge=vmbr0,hwaddr={self.hwaddr},ip=dhcp,type=veth",
            **self.config,
        }


class MemoryBackend(Backend):
    """Containers in memory: start and stop flip a flag; ``fail_start`` makes starts fail."""

    def __init__(self, cts: list[MemoryCt]) -> None:
        self.cts = {ct.vmid: ct for ct in cts}
        self.fail_start: set[int] = set()

    def vmids(self) -> list[int]:
        return sorted(self.cts)

    def status(self, vmid: int) -> str:
        return "running" if self.cts[vmid].running else "stopped"

    def start(self, vmid: int) -> None:
        if vmid in self.fail_start:
            raise BackendError(f"startup for container '{vmid}' failed")
        self.cts[vmid].running = True

    def stop(self, vmid: int) -> None:
        self.cts[vmid].running = False

    def config(self, vmid: int) -> dict[str, Any]:
        return dict(self.cts[vmid].config)

    def interfaces(self, vmid: int) -> list[dict[str, Any]]:
        ct = self.cts[vmid]
        eth0 = interface("eth0", ct.hwaddr.lower(), [*ct.addresses, link_local_for(ct.hwaddr)])
        return [LOOPBACK, eth0]


def _lxc_keys(path: Path) -> list[tuple[str, str]]:
    pairs = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "=" in line:
            key, value = line.split("=", 1)
            pairs.append((key.strip(), value.strip()))
    return pairs


class LxcBackend(Backend):
    """Real LXC containers named by vmid (``lxc-info``/``lxc-start``/``lxc-stop``), read live.

    The pct.conf view is derived from ``<lxc_path>/<vmid>/config``: ``lxc.net.0.ipv4.address``
    becomes ``net0``'s ``ip=``, ``lxc.uts.name`` the hostname, other ``lxc.cgroup*``/``lxc.mount``
    keys the raw ``lxc`` pairs. A ``pve.conf`` beside it adds pct.conf lines LXC itself never reads
    (``dev0: /dev/nvidia0,gid=44``, ``unprivileged: 1``, ``lxc.…: …``), as PVE's own file holds them
    before it writes the LXC config. ``vmids`` limits the backend to some containers.
    """

    def __init__(self, vmids: list[int] | None = None, *, lxc_path: str = "/var/lib/lxc",
                 timeout: float = 30.0) -> None:
        self.lxc_path = Path(lxc_path)
        self.only = set(vmids) if vmids is not None else None
        self.timeout = timeout
        self._lock = threading.Lock()

    def _lxc(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*argv, "-P", str(self.lxc_path)], capture_output=True, text=True, timeout=self.timeout, check=False
        )

    def _config_path(self, vmid: int) -> Path:
        path = self.lxc_path / str(vmid) / "config"
        if (self.only is not None and vmid not in self.only) or not path.is_file():
            raise KeyError(vmid)
        return path

    def vmids(self) -> list[int]:
        if not self.lxc_path.is_dir():
            return []
        found = [int(p.name) for p in self.lxc_path.iterdir() if p.name.isdigit() and (p / "config").is_file()]
        return sorted(v for v in found if self.only is None or v in self.only)

    def status(self, vmid: int) -> str:
        self._config_path(vmid)
        out = self._lxc("lxc-info", "-n", str(vmid), "-s", "-H").stdout.strip()
        return "running" if out in ("RUNNING", "FROZEN") else "stopped"  # Proxmox reports a frozen CT as running

    def start(self, vmid: int) -> None:
        self._config_path(vmid)
        with self._lock:
            done = self._lxc("lxc-start", "-n", str(vmid))
        if done.returncode != 0 or self.status(vmid) != "running":
            raise BackendError(f"startup for container '{vmid}' failed")

    def stop(self, vmid: int) -> None:
        self._config_path(vmid)
        with self._lock:
            self._lxc("lxc-stop", "-n", str(vmid), "-k")

    def config(self, vmid: int) -> dict[str, Any]:
        pairs = _lxc_keys(self._config_path(vmid))
        keys = dict(pairs)
        net = [f"name={keys.get('lxc.net.0.name', 'eth0')}", f"bridge={keys.get('lxc.net.0.link', 'vmbr0')}"]
        if "lxc.net.0.ipv4.gateway" in keys:
            net.append(f"gw={keys['lxc.net.0.ipv4.gateway']}")
        if "lxc.net.0.hwaddr" in keys:
            net.append(f"hwaddr={keys['lxc.net.0.hwaddr'].upper()}")
        net += [f"ip={keys.get('lxc.net.0.ipv4.address', 'dhcp')}", "type=veth"]
        raw = [[k, v] for k, v in pairs if k.startswith(("lxc.cgroup", "lxc.mount.entry", "lxc.apparmor"))]
        config: dict[str, Any] = {
            "arch": keys.get("lxc.arch", "amd64"),
            "hostname": keys.get("lxc.uts.name", f"CT{vmid}"),
            "cores": 1,
            "memory": 512,
            "ostype": "debian",
            "rootfs": f"local:{vmid}/rootfs,size=8G",
            "net0": ",".join(net),
            "unprivileged": 0,
        }
        extra = self.lxc_path / str(vmid) / "pve.conf"
        for line in extra.read_text().splitlines() if extra.is_file() else []:
            key, sep, value = line.partition(":")
            if not sep or line.lstrip().startswith("#"):
                continue
            if key.strip().startswith("lxc."):
                raw.append([key.strip(), value.strip()])
            else:
                config[key.strip()] = int(value) if value.strip().isdigit() else value.strip()
        if raw:
            config["lxc"] = raw
        return config

    def interfaces(self, vmid: int) -> list[dict[str, Any]]:
        keys = dict(_lxc_keys(self._config_path(vmid)))
        hwaddr = keys.get("lxc.net.0.hwaddr", "00:00:00:00:00:00").lower()
        static = keys.get("lxc.net.0.ipv4.address", "")
        prefix = static.split("/", 1)[1] if "/" in static else "24"
        addresses = []
        for line in self._lxc("lxc-info", "-n", str(vmid), "-i", "-H").stdout.split():
            ip = ipaddress.ip_address(line)
            if not ip.is_loopback:
                addresses.append(f"{ip}/{prefix if ip.version == 4 else 64}")
        return [LOOPBACK, interface(keys.get("lxc.net.0.name", "eth0"), hwaddr, addresses)]
