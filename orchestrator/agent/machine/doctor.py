"""What ``orch doctor`` needs to know about the target, gathered in one call; the controller judges it.

Facts only, no verdicts: the device nodes (kind, major:minor, mode, whether this user may open them and
what the kernel says when it tries), what ``nvidia-smi`` answers (the GPU report ``orch gpus`` reads too), the
user-space NVML (``libnvidia-ml.so.X.Y``) and kernel module versions, ``/dev/shm``, free space, python,
tmux, the clock and, only when asked, what torch sees (in a child interpreter: importing torch costs
seconds and must never take the agent down).

    facts(layout, devices=["/dev/nvidia0"], checkpoints="/workspace/checkpoints", torch=False)
"""

from __future__ import annotations

import errno
import glob
import json
import os
import shutil
import stat
import subprocess
import sys
import time

from ..layout import Layout

LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
            "/usr/local/lib", "/usr/local/nvidia/lib64")
MODULE_VERSION = "/proc/driver/nvidia/version"
TORCH_TIMEOUT = 120.0
OUTPUT_CHARS = 4000

# run by the target's python in a child: one JSON line on stdout whatever happens
TORCH_PROBE = r"""
import json, sys
out = {"installed": False}
try:
    import torch
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"[:500] if not isinstance(exc, ModuleNotFoundError) else None
else:
    out.update(installed=True, version=torch.__version__, cuda=getattr(torch.version, "cuda", None))
    try:
        out["available"] = bool(torch.cuda.is_available())
        out["count"] = int(torch.cuda.device_count())
    except Exception as exc:
        out.update(available=False, count=0, error=f"{type(exc).__name__}: {exc}"[:500])
print(json.dumps(out))
"""


def _device(path: str) -> dict:
    """One device node as this user sees it: exists, char, major:minor, mode, owner and an open's outcome."""
    out: dict = {"path": path, "exists": False}
    try:
        st = os.stat(path)
    except OSError as exc:
        out["error"] = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        return out
    out.update(exists=True, char=stat.S_ISCHR(st.st_mode), major=os.major(st.st_rdev), minor=os.minor(st.st_rdev),
               mode=stat.S_IMODE(st.st_mode), uid=st.st_uid, gid=st.st_gid,
               access=os.access(path, os.R_OK | os.W_OK))
    if out["char"]:
        # what the kernel answers: EPERM is the device cgroup refusing, EACCES the mode, ENXIO/ENODEV no
        # driver behind the node; opening a GPU's node changes nothing (nvidia-smi does it every time)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError as exc:
            out["open"] = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        else:
            os.close(fd)
            out["open"] = "ok"
    return out


def _nvidia_smi() -> dict:
    """nvidia-smi's report (``system.gpu_report``: its GPUs, driver version, or its own error and exit code)."""
    from .system import gpu_report

    if not shutil.which("nvidia-smi"):
        return {"found": False}
    return {"found": True, **gpu_report(apps=False)}


def _nvml_libraries() -> list[str]:
    """The user-space NVML libraries, by file name (``libnvidia-ml.so.550.127.05``): their version is the
    user-space driver's."""
    found = []
    for folder in LIB_DIRS:
        found += [os.path.basename(p) for p in glob.glob(os.path.join(folder, "libnvidia-ml.so.*"))]
    return sorted(set(found))


def _read_first_line(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.readline().strip() or None
    except OSError:
        return None


def _space(path: str) -> dict:
    """Total and free bytes of the filesystem ``path`` is (or would be) on: its nearest existing folder."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe) and probe != "/":
        probe = os.path.dirname(probe)
    try:
        st = os.statvfs(probe)
    except OSError as exc:
        return {"path": path, "error": str(exc)}
    return {"path": path, "on": probe, "total": st.f_blocks * st.f_frsize, "free": st.f_bavail * st.f_frsize}


def _tmux() -> str | None:
    tmux = shutil.which("tmux")
    if not tmux:
        return None
    from .system import tmux_version

    return tmux_version(tmux) or "?"


def _torch() -> dict:
    try:
        proc = subprocess.run([sys.executable, "-c", TORCH_PROBE], capture_output=True, text=True,
                              timeout=TORCH_TIMEOUT)
    except subprocess.TimeoutExpired:
        return {"installed": None, "error": f"importing torch took over {TORCH_TIMEOUT:g} s"}
    except OSError as exc:
        return {"installed": None, "error": str(exc)}
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"installed": None, "error": (proc.stderr.strip() or f"exit {proc.returncode}")[-500:]}


def facts(layout: Layout, devices: list | None = None, checkpoints: str | None = None, torch: bool = False) -> dict:
    """Everything the doctor judges on this target; ``devices`` are the nodes the CT config passes through
    (every ``/dev/nvidia*`` present is looked at as well)."""
    paths = list(dict.fromkeys([*(devices or []), *sorted(glob.glob("/dev/nvidia*"))]))
    out = {
        "time": time.time(),
        "python": ".".join(map(str, sys.version_info[:3])), "executable": sys.executable,
        "tmux": _tmux(),
        "user": {"uid": os.geteuid(), "gid": os.getegid(), "groups": sorted(os.getgroups())},
        "devices": [_device(p) for p in paths if not os.path.isdir(p)],
        "nvidia_smi": _nvidia_smi(),
        "nvml_libraries": _nvml_libraries(),
        "kernel_module": _read_first_line(MODULE_VERSION),
        "shm": _space("/dev/shm") if os.path.isdir("/dev/shm") else {"path": "/dev/shm", "error": "missing"},
        "space": {"root": _space(layout.root), **({"checkpoints": _space(checkpoints)} if checkpoints else {})},
    }
    if torch:
        out["torch"] = _torch()
    return out
