"""``orch doctor``'s verdicts: a target's facts (``agent/machine/doctor.py``), its CT config and its node's driver, in
findings, each ``ok``/``warn``/``fail`` with the reason and the fix as the command to run. Pure: no I/O.

    findings = judge(Facts(agent=..., ct={"vmid": 200, "node": "pve1", "config": summary}, node_smi=...))
    [f for f in findings if f.status == "fail"]   # what a deploy refuses on

NCCL's guidance for ``/dev/shm`` (its troubleshooting notes for containers): its shared-memory transport
between the GPUs of one machine needs more than a container's usual 64 MB; NCCL suggests ``--shm-size=1g``.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

OK, WARN, FAIL = "ok", "warn", "fail"
MIB = 1 << 20
GIB = 1 << 30
SHM_FOR_NCCL = GIB  # NCCL's documented --shm-size=1g
MIN_PYTHON = (3, 10)
MIN_TMUX = (3, 2)  # agent/run/tmux.py's NEEDED (new-session -e), which a deploy's preflight refuses below; kept here
# as a number so that this module stays pure
LOW_SPACE = GIB
CLOCK_SKEW_S = 2.0
NVIDIA_MAJOR = 195
GPU_NODE = re.compile(r"/dev/nvidia(\d+)")
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm")
MISMATCH = "Driver/library version mismatch"
VERSION = re.compile(r"\d+\.\d+(?:\.\d+)?")
RULE = re.compile(r"([cba])\s+(\*|\d+):(\*|\d+)\s+([rwm]+)")


@dataclass(frozen=True)
class Finding:
    check: str
    status: str
    reason: str
    fix: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Facts:
    """What the doctor knows: the agent's facts, the CT (``vmid``, ``node``, ``config``: proxmox's
    ``config_summary``) when the target is one, the node's ``nvidia-smi`` answer (in ``system.gpu_report``'s
    shape; None: the node was not asked) and the controller's clock before and after the call."""

    agent: dict
    ct: dict | None = None
    node_smi: dict | None = None
    node_error: str | None = None
    sent: float = 0.0
    received: float = 0.0
    min_free_mb: int = 50
    torch_asked: bool = False
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Passed:
    """One device node the CT config passes through: by ``devN:`` (PVE makes the node and allows it) or by
    ``lxc.mount.entry`` (the node's own file bound in; a cgroup rule must allow it)."""

    path: str
    key: str  # dev0, lxc.mount.entry
    options: dict


def passed_devices(config: dict | None) -> list[Passed]:
    if not config:  # not a CT: nothing is passed through (and the Proxmox module stays unloaded)
        return []
    from ..reach.proxmox import parse_prop_string

    found: dict[str, Passed] = {}
    for key, value in ((config or {}).get("devices") or {}).items():
        opts = parse_prop_string(value, "path")
        if opts.get("path", "").startswith("/dev/nvidia"):
            found.setdefault(opts["path"], Passed(opts["path"], key, opts))
    for line in (config or {}).get("lxc") or []:
        key, _, value = line.partition(": ")
        source = value.split(" ")[0] if key == "lxc.mount.entry" else ""
        if source.startswith("/dev/nvidia"):
            found.setdefault(source, Passed(source, key, {}))
    return list(found.values())


def cgroup_rules(config: dict | None) -> list[tuple[str, str, str, str]]:
    """``(kind, major, minor, access)`` of the config's ``lxc.cgroup2.devices.allow`` (and cgroup v1's
    ``lxc.cgroup.devices.allow``) lines."""
    rules = []
    for line in (config or {}).get("lxc") or []:
        key, _, value = line.partition(": ")
        if key in ("lxc.cgroup2.devices.allow", "lxc.cgroup.devices.allow"):
            m = RULE.fullmatch(value.strip())
            if m:
                rules.append((m[1], m[2], m[3], m[4]))
    return rules


def allowed(rules: list[tuple[str, str, str, str]], major: int, minor: int) -> bool:
    return any(kind in ("c", "a") and maj in ("*", str(major)) and mi in ("*", str(minor))
               and "r" in acc and "w" in acc for kind, maj, mi, acc in rules)


def smi_failure(smi: dict) -> str | None:
    """nvidia-smi's own complaint (``system.gpu_report``'s ``error``), or None when it answered."""
    return smi.get("error") or None


def library_version(name: str) -> str | None:
    """``libnvidia-ml.so.550.127.05`` -> ``550.127.05``; the ``.so.1`` link names no version."""
    tail = name.split(".so.", 1)[1] if ".so." in name else ""
    return tail if VERSION.fullmatch(tail) else None


def _same(a: str, b: str) -> bool:
    """Versions agree on what both name (NVML's message gives ``535.183``, the driver ``535.183.01``)."""
    pa, pb = a.split("."), b.split(".")
    n = min(len(pa), len(pb))
    return pa[:n] == pb[:n]


def _size(n: int | float) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / MIB:.0f} MiB"


class _Where:
    """How a fix is said for this target: ``pct`` commands on a CT's node, plain ones elsewhere."""

    def __init__(self, facts: Facts) -> None:
        self.ct = facts.ct
        self.vmid = facts.ct.get("vmid") if facts.ct else None
        self.node = facts.ct.get("node") if facts.ct else None
        used = set(((facts.ct or {}).get("config") or {}).get("devices") or {})
        self._free = (f"dev{i}" for i in range(256) if f"dev{i}" not in used)
        self.taken: dict[str, str] = {}

    def in_target(self, *argv: str) -> str:
        return f"pct exec {self.vmid} -- {' '.join(argv)}" if self.vmid else " ".join(argv)

    def on_node(self, text: str) -> str:
        return f"on node {self.node}: {text}" if self.node else text

    def dev_key(self, path: str) -> str:
        if path not in self.taken:
            self.taken[path] = next(self._free)
        return self.taken[path]


def _driver(facts: Facts, gpus: bool, where: _Where) -> list[Finding]:
    agent = facts.agent
    smi = agent.get("nvidia_smi") or {}
    node_version = None
    out = []
    if facts.node_smi is not None:
        failure = smi_failure(facts.node_smi)
        versions = [facts.node_smi["driver_version"]] if failure is None and facts.node_smi.get("driver_version") \
            else []
        if not facts.node_smi.get("found", True):
            out.append(Finding("node driver", WARN, f"node {where.node} has no nvidia-smi",
                               where.on_node("apt install nvidia-smi (or the driver's .run installer)")))
        elif failure or not versions:
            out.append(Finding("node driver", FAIL, f"nvidia-smi on node {where.node} fails: {failure}",
                               where.on_node("modprobe nvidia && nvidia-smi")))
        else:
            node_version = versions[0]
            out.append(Finding("node driver", OK, f"node {where.node} runs driver {node_version}"))
    module = VERSION.search(agent.get("kernel_module") or "")
    if facts.node_smi is None and facts.node_error and gpus and not module:  # else the CT's /proc tells the module
        out.append(Finding("node driver", WARN, f"node {where.node} was not asked: {facts.node_error}"))
    kernel = node_version or (module[0] if module else None)
    libs = [v for v in map(library_version, agent.get("nvml_libraries") or []) if v]
    wanted = kernel or "VERSION"  # the node's driver, when it could not be asked
    installer = where.in_target(f"sh NVIDIA-Linux-x86_64-{wanted}.run --no-kernel-module")
    if not smi.get("found"):
        if gpus:
            out.append(Finding("user-space driver", FAIL, "GPUs are passed through but nvidia-smi is not installed "
                               "here (no user-space driver)", installer))
        return out
    failure = smi_failure(smi)
    if failure is not None:
        text = f"{failure}\n{smi.get('detail') or ''}"
        lib = re.search(r"NVML library version:\s*(\S+)", text)
        if MISMATCH in text:
            theirs = lib[1] if lib else (libs[0] if libs else "?")
            out.append(Finding("user-space driver", FAIL,
                               f"nvidia-smi: Failed to initialize NVML: {MISMATCH} (user space {theirs}, "
                               f"kernel module {kernel or '?'})", installer))
        else:
            out.append(Finding("user-space driver", FAIL if gpus else WARN, f"nvidia-smi fails: {failure}",
                               where.on_node("modprobe nvidia && nvidia-smi")))
        return out
    mine = smi.get("driver_version")
    bad = [v for v in [*([mine] if mine else []), *libs] if kernel and not _same(v, kernel)]
    if bad:
        out.append(Finding("user-space driver", FAIL, f"user space has driver {bad[0]} but the kernel module is "
                           f"{kernel}: CUDA fails with '{MISMATCH}'", installer))
    else:
        lib_text = f", libnvidia-ml {libs[0]}" if libs else ""
        out.append(Finding("user-space driver", OK, f"nvidia-smi reports driver {mine or '?'}{lib_text}"
                           + (", as the node" if node_version else "")))
    return out


def _devices(facts: Facts, passed: list[Passed], where: _Where) -> list[Finding]:
    config = (facts.ct or {}).get("config") or {}
    rules = cgroup_rules(config)
    unprivileged = bool(config.get("unprivileged"))
    seen = {d["path"]: d for d in facts.agent.get("devices") or []}
    by_path = {p.path: p for p in passed}
    present = [] if facts.ct else [p for p, d in seen.items() if GPU_NODE.fullmatch(p) and d.get("exists")]
    wanted = list(dict.fromkeys([*by_path, *present, *CONTROL_NODES]))
    user = facts.agent.get("user") or {}
    out = []
    for path in wanted:
        how = by_path.get(path)
        dev = seen.get(path) or {"exists": False}
        name = f"device {path}"
        if not dev.get("exists") or not dev.get("char"):
            if how is None and facts.ct:
                fix = f"pct set {where.vmid} -{where.dev_key(path)} {path}"
                if path == "/dev/nvidia-uvm":  # the node makes it only once something loads nvidia-uvm
                    fix = where.on_node("nvidia-modprobe -u -c=0 && " + fix)
                out.append(Finding(name, FAIL, f"{path} is not passed through to CT {where.vmid}", fix))
            elif how is None:
                out.append(Finding(name, FAIL, f"{path} is missing", "nvidia-modprobe -u -c=0 (as root)"))
            else:
                what = "is not a character device" if dev.get("exists") else "is missing in the CT"
                out.append(Finding(name, FAIL, f"{path} is passed through ({how.key}) but {what}",
                                   where.on_node(f"ls -l {path} && pct reboot {where.vmid}")))
            continue
        numbers = f"{dev['major']}:{dev['minor']}"
        if facts.ct and (how is None or not how.key.startswith("dev")) and not allowed(rules, dev["major"],
                                                                                     dev["minor"]):
            out.append(Finding(name, FAIL, f"{path} is {numbers} but no lxc.cgroup2.devices.allow rule of CT "
                               f"{where.vmid} grants major {dev['major']}",
                               f"pct set {where.vmid} -{where.dev_key(path)} {path} (or add 'lxc.cgroup2.devices.allow: "
                               f"c {dev['major']}:* rwm' to /etc/pve/lxc/{where.vmid}.conf)"))
            continue
        if dev.get("open") == "EPERM":
            out.append(Finding(name, FAIL, f"{path} ({numbers}): the kernel's device cgroup refuses to open it",
                               f"pct set {where.vmid} -{where.dev_key(path)} {path}" if facts.ct else None))
            continue
        if not dev.get("access") or dev.get("open") == "EACCES":
            gid = user.get("gid", 0)
            if facts.ct and how is not None and how.key.startswith("dev"):
                fix = f"pct set {where.vmid} -{how.key} {path},gid={gid}"
            elif facts.ct:
                fix = f"pct set {where.vmid} -{where.dev_key(path)} {path},gid={gid}" + \
                      (" (an unprivileged CT needs PVE 8.1+'s devN form)" if unprivileged else "")
            else:
                fix = f"chgrp {gid} {path} && chmod g+rw {path}"
            out.append(Finding(name, FAIL, f"{path} ({numbers}, mode {dev.get('mode', 0):o}, owner "
                               f"{dev.get('uid')}:{dev.get('gid')}) cannot be opened read-write by uid "
                               f"{user.get('uid')}", fix))
            continue
        opened = dev.get("open")
        note = "" if opened in (None, "ok") else f"; opening it: {opened} (no driver behind it here)"
        out.append(Finding(name, OK, f"{path} {numbers}, " +
                           ("passed by " + how.key if how else "present") + ", read-write for uid "
                           f"{user.get('uid')}{note}"))
    return out


def _shm(facts: Facts, gpus: int, where: _Where) -> Finding:
    shm = facts.agent.get("shm") or {}
    if shm.get("error"):
        return Finding("/dev/shm", FAIL if gpus > 1 else WARN, f"/dev/shm: {shm['error']}",
                       where.in_target("mount -t tmpfs -o size=16G tmpfs /dev/shm"))
    total = shm.get("total", 0)
    fix = where.in_target("mount -o remount,size=16G /dev/shm") + \
        " (and size=16G for /dev/shm in /etc/fstab there, to keep it)"
    if total >= SHM_FOR_NCCL or gpus == 0:
        return Finding("/dev/shm", OK, f"/dev/shm is {_size(total)}" + (f" for {gpus} GPUs" if gpus else ""))
    status = FAIL if gpus > 1 else WARN
    return Finding("/dev/shm", status, f"/dev/shm is {_size(total)}: NCCL between {gpus} GPUs needs at least "
                   f"{_size(SHM_FOR_NCCL)} (its guidance: --shm-size=1g)" if gpus > 1 else
                   f"/dev/shm is {_size(total)}: DataLoader workers share batches through it (1 GiB or more)", fix)


def _space(facts: Facts) -> list[Finding]:
    out = []
    for what, info in (facts.agent.get("space") or {}).items():
        label = {"root": "orch's root", "checkpoints": "the checkpoint folder"}.get(what, what)
        if info.get("error"):
            out.append(Finding(f"space {what}", WARN, f"{label} {info.get('path')}: {info['error']}"))
            continue
        free = info.get("free", 0)
        text = f"{_size(free)} free for {label} {info.get('path')}"
        if what == "root" and free < facts.min_free_mb * MIB:  # the checkpoints' needs are the run's to know
            out.append(Finding(f"space {what}", FAIL, text, "orch checkpoints purge, or free space there"))
        elif free < LOW_SPACE:
            out.append(Finding(f"space {what}", WARN, text, "orch checkpoints purge, or free space there"))
        else:
            out.append(Finding(f"space {what}", OK, text))
    return out


def _tools(facts: Facts, where: _Where) -> list[Finding]:
    agent = facts.agent
    out = []
    version = tuple(int(x) for x in str(agent.get("python", "0")).split(".")[:2] if x.isdigit())
    need = ".".join(map(str, MIN_PYTHON))
    if version >= MIN_PYTHON:
        out.append(Finding("python", OK, f"python {agent.get('python')} ({agent.get('executable')})"))
    else:
        out.append(Finding("python", FAIL, f"python {agent.get('python')}: orch's agent needs {need} or newer",
                           where.in_target("apt-get install python3")))
    tmux = agent.get("tmux")
    found = re.search(r"(\d+)\.(\d+)", tmux or "")
    if not tmux:
        out.append(Finding("tmux", FAIL, "tmux is not installed", where.in_target("apt-get install tmux")))
    elif found and (int(found[1]), int(found[2])) < MIN_TMUX:
        out.append(Finding("tmux", FAIL, f"{tmux}: orch needs tmux {'.'.join(map(str, MIN_TMUX))} or newer "
                           "(new-session -e)", "install a newer tmux there (Debian 12 and Ubuntu 22.04 ship one)"))
    else:
        out.append(Finding("tmux", OK, tmux))
    told, sent, received = agent.get("time"), facts.sent, facts.received
    if told and sent and received:
        skew = float(told) - (sent + received) / 2
        slack = (received - sent) / 2
        if abs(skew) > CLOCK_SKEW_S + slack:
            out.append(Finding("clock", WARN, f"the target's clock is {skew:+.1f} s off the controller's",
                               where.on_node("timedatectl set-ntp true") if where.node else
                               "timedatectl set-ntp true (on whichever machine is off)"))
        else:
            out.append(Finding("clock", OK, f"within {max(abs(skew), slack):.1f} s of the controller's"))
    return out


def _torch(facts: Facts, gpus: int) -> Finding | None:
    probe = facts.agent.get("torch")
    if probe is None:
        return None
    python = facts.agent.get("executable", "python")
    if probe.get("installed") is False:
        return Finding("torch", OK, f"torch is not installed for {python}: not checked")
    if probe.get("installed") is None:
        return Finding("torch", WARN, f"torch could not be asked: {probe.get('error')}")
    count = int(probe.get("count") or 0)
    seen = f"torch {probe.get('version')} sees {count} GPU{'s' if count != 1 else ''}" + \
        (f" (cuda.is_available() {probe.get('available')})" if gpus else "")
    if gpus and (not probe.get("available") or count < gpus):
        why = f"; {probe['error']}" if probe.get("error") else ""
        build = "" if probe.get("cuda") else " (a CPU-only build: install a CUDA wheel)"
        return Finding("torch", FAIL, f"{seen} of the {gpus} passed through{build}{why}",
                       "fix the checks above; then " + f"{python} -c 'import torch; print(torch.cuda.device_count())'")
    return Finding("torch", OK, seen)


def gpu_count(facts: Facts, passed: list[Passed]) -> int:
    """The GPUs this target should have: the ``/dev/nvidiaN`` the CT passes, else those present."""
    named = {p.path for p in passed if GPU_NODE.fullmatch(p.path)}
    if not named and not facts.ct:
        named = {d["path"] for d in facts.agent.get("devices") or [] if GPU_NODE.fullmatch(d["path"])
                 and d.get("exists")}
    return len(named)


def judge(facts: Facts) -> list[Finding]:
    """Every finding for one target, GPU checks only where GPUs are passed through or present."""
    config = (facts.ct or {}).get("config")
    passed = passed_devices(config)
    where = _Where(facts)
    gpus = gpu_count(facts, passed)
    smi_found = bool((facts.agent.get("nvidia_smi") or {}).get("found"))
    out: list[Finding] = []
    if gpus or smi_found or passed:
        out += _driver(facts, bool(gpus), where)
    if gpus or passed:
        out += _devices(facts, passed, where)
    out.append(_shm(facts, gpus, where))
    out += _space(facts)
    out += _tools(facts, where)
    torch = _torch(facts, gpus)
    if torch is not None:
        out.append(torch)
    return out


def worst(findings: list[Finding]) -> str:
    states = {f.status for f in findings}
    return FAIL if FAIL in states else WARN if WARN in states else OK
