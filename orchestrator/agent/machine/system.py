"""What the target offers: interpreter, tmux, disk, GPUs. Checked before anything changes."""

from __future__ import annotations

import os
import shutil
import sys

from .. import procstat
from ..layout import Layout
from ..protocol import AgentFailure


GPU_QUERY = ("index", "uuid", "name", "utilization.gpu", "memory.used", "memory.total", "temperature.gpu",
             "power.draw", "power.limit", "pci.bus_id", "driver_version")
GPU_KEYS = ("index", "uuid", "name", "util", "mem_used_mib", "mem_total_mib", "temperature_c", "power_w",
            "power_limit_w", "pci_bus_id", "driver_version")
APP_QUERY = ("pid", "gpu_uuid", "process_name", "used_memory")
APP_KEYS = ("pid", "gpu_uuid", "process_name", "mem_used_mib")


def parse_csv(text: str, keys: tuple[str, ...]) -> list[dict]:
    """Rows of ``nvidia-smi --query-…=… --format=csv,noheader,nounits`` as dicts; ``[N/A]`` and
    ``[Not Supported]`` become None. GPU names hold no comma, so a plain split is exact."""
    rows = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(", ")] if ", " in line else [p.strip() for p in line.split(",")]
        if len(parts) != len(keys):
            continue
        rows.append({k: (None if v.startswith("[") else v) for k, v in zip(keys, parts)})
    return rows


def _smi(smi: str, *argv: str) -> tuple[int | None, str]:
    import subprocess  # (here: a status on a machine without nvidia-smi imports none of it)

    try:
        proc = subprocess.run([smi, *argv], capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return None, "nvidia-smi did not answer within 10 s"
    except OSError as exc:
        return None, f"nvidia-smi could not be run: {exc}"
    return proc.returncode, proc.stdout if proc.returncode == 0 else (proc.stdout + proc.stderr).strip()


def gpus() -> list:
    """GPUs as nvidia-smi reports them; an empty list where there is none or no driver."""
    return gpu_report(apps=False)["gpus"]


def gpu_report(layout: Layout | None = None, apps: bool = True) -> dict:
    """The GPUs nvidia-smi sees, the compute processes on them and, with ``layout``, which of those
    belong to orch's runs (``owner``: the run whose command is the process or one of its ancestors).

    ``error`` is nvidia-smi's own message when it fails (no driver, a driver/library mismatch), with its
    exit code; ``gpus`` is then empty.
    """
    smi = shutil.which("nvidia-smi")
    out: dict = {"gpus": [], "apps": [], "error": None, "exit_code": None, "driver_version": None}
    if not smi:
        out["error"] = "nvidia-smi is not installed"
        return out
    code, text = _smi(smi, "--query-gpu=" + ",".join(GPU_QUERY), "--format=csv,noheader,nounits")
    if code != 0:
        out.update(error=text.splitlines()[0] if text else f"nvidia-smi exited {code}", exit_code=code,
                   detail=text[-1000:])
        return out
    out["gpus"] = parse_csv(text, GPU_KEYS)
    for gpu in out["gpus"]:
        out["driver_version"] = gpu.pop("driver_version")
    if not apps:
        return out
    code, text = _smi(smi, "--query-compute-apps=" + ",".join(APP_QUERY), "--format=csv,noheader,nounits")
    if code == 0:
        out["apps"] = parse_csv(text, APP_KEYS)
    else:  # who uses the GPUs is unknown: none of them may be called free
        out["apps_error"] = text.splitlines()[0] if text else f"nvidia-smi exited {code}"
    if layout is not None:
        owners = _run_pids(layout)
        for app in out["apps"]:
            app["owner"] = _owner(app.get("pid"), owners)
    return out


def _run_pids(layout: Layout) -> dict[int, dict]:
    """The supervisor and command pids of every live run under this root (any project), to its run."""
    from ..layout import read_json
    from ..run.runs import alive_runs

    pids: dict[int, dict] = {}
    for run in alive_runs(layout):
        pid = read_json(os.path.join(layout.run_dir(run["id"], run.get("registry")), "pid.json"), {}) or {}
        who = {"id": run["id"], "registry": run.get("registry"), "project": run.get("project")}
        for key in ("child", "supervisor"):
            if isinstance(pid.get(key), int):
                pids.setdefault(pid[key], who)
    return pids


_parent = procstat.parent


def _owner(pid: object, owners: dict[int, dict]) -> dict | None:
    """The run whose recorded pid is ``pid`` or an ancestor of it (a GPU process is often a child)."""
    try:
        current: int | None = int(str(pid))
    except ValueError:
        return None
    seen = set()
    while current and current not in seen:
        if current in owners:
            return owners[current]
        seen.add(current)
        current = _parent(current)
    return None


def prune_agents(layout: Layout, current: str, min_age_s: float = 86400.0) -> list:
    """Remove agent versions left by older orch releases: never the current one, one used by a live
    run (its PYTHONPATH points there), or one younger than a day (another controller may use it)."""
    import time

    from ..layout import read_json
    from ..run.runs import alive_runs

    folder = os.path.join(layout.root, "agent")
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    keep = {os.path.basename(current)[:-4]}
    for run in alive_runs(layout):
        launch = read_json(os.path.join(layout.run_dir(run["id"], run.get("registry")), "launch.json"), {}) or {}
        for part in str((launch.get("env") or {}).get("PYTHONPATH", "")).split(os.pathsep):
            keep.add(os.path.basename(part).rsplit(".", 1)[0])
    removed = []
    for name in sorted(names):
        stem = name.rsplit(".", 1)[0]
        full = os.path.join(folder, name)
        if not name.startswith("agent-") or stem in keep:
            continue
        try:
            if time.time() - os.lstat(full).st_mtime < min_age_s:
                continue
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full)
            else:
                os.unlink(full)
            removed.append(name)
        except OSError:
            continue
    return removed


_TMUX_VERSIONS: dict[tuple, str] = {}  # a resident agent asks each tmux binary once


def tmux_version(tmux: str) -> str:
    """``tmux -V`` of the binary at ``tmux``, asked again only when that file changes."""
    try:
        st = os.stat(tmux)
    except OSError:
        return "?"
    key = (tmux, st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _TMUX_VERSIONS:
        import subprocess

        try:
            _TMUX_VERSIONS[key] = subprocess.run([tmux, "-V"], capture_output=True, text=True,
                                                 timeout=10).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return "?"
    return _TMUX_VERSIONS[key]


def preflight(layout: Layout, min_free_mb: int = 50) -> dict:
    tmux = shutil.which("tmux")
    if not tmux:
        raise AgentFailure("agent", "tmux is not installed on the target",
                           "install it there (apt-get install tmux) and deploy again")
    from ..run.tmux import too_old

    version = tmux_version(tmux)
    too_old(version)
    layout.ensure()
    usage = shutil.disk_usage(layout.root)
    free_mb = usage.free // (1 << 20)
    if free_mb < min_free_mb:
        raise AgentFailure("agent", f"only {free_mb} MB free under {layout.root} on the target",
                           "free some space there (orch checkpoints purge) or move [paths] root")
    return {"python": ".".join(map(str, sys.version_info[:3])), "executable": sys.executable, "tmux": version,
            "free_mb": free_mb, "gpus": gpus(), "hostname": os.uname().nodename,
            "pruned_agents": prune_agents(layout, os.path.abspath(sys.argv[0]))}


def _route_table() -> list[tuple[str, int, int, int]]:
    """(interface, destination, mask, metric) from /proc/net/route, as host-order integers."""
    import socket
    import struct

    rows = []
    try:
        with open("/proc/net/route", encoding="ascii") as fh:
            next(fh, None)
            for line in fh:
                f = line.split()
                if len(f) >= 8 and int(f[3], 16) & 1:  # RTF_UP
                    dest, mask = (struct.unpack("!I", socket.inet_aton(socket.inet_ntoa(
                        struct.pack("<I", int(x, 16)))))[0] for x in (f[1], f[7]))
                    rows.append((f[0], dest, mask, int(f[6])))
    except OSError:
        return []
    return rows


def _if_address(name: str) -> str | None:
    """The IPv4 address of an interface (SIOCGIFADDR), or None."""
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def net_route(layout: Layout, peer: str | None = None) -> dict:
    """The interface that routes to ``peer`` (default route without one) and this node's address on it.

    Read from /proc/net/route, which has no local table: a node asking about its own address gets the
    interface that holds it, not ``lo``.
    """
    import socket
    import struct

    target = 0
    if peer:
        try:
            target = struct.unpack("!I", socket.inet_aton(socket.gethostbyname(peer)))[0]
        except OSError:
            raise AgentFailure("input", f"cannot resolve {peer!r} on this node", "give the node's IP address") from None
    routes = [r for r in _route_table() if target & r[2] == r[1]]
    if not routes:
        return {"interface": None, "address": None}
    name = max(routes, key=lambda r: (bin(r[2]).count("1"), -r[3]))[0]
    return {"interface": name, "address": _if_address(name)}
