"""What the target offers: interpreter, tmux, disk, GPUs. Checked before anything changes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from .layout import Layout
from .protocol import AgentFailure


def gpus() -> list:
    """GPUs as nvidia-smi reports them; an empty list where there is none or no driver."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    query = "index,name,utilization.gpu,memory.used,memory.total"
    try:
        out = subprocess.run([smi, f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    found = []
    for line in out.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 5:
            found.append({"index": parts[0], "name": parts[1], "util": parts[2], "mem_used_mib": parts[3],
                          "mem_total_mib": parts[4]})
    return found


def preflight(layout: Layout, min_free_mb: int = 50) -> dict:
    tmux = shutil.which("tmux")
    if not tmux:
        raise AgentFailure("agent", "tmux is not installed on the target",
                           "install it there (apt-get install tmux) and deploy again")
    try:
        version = subprocess.run([tmux, "-V"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        version = "?"
    layout.ensure()
    usage = shutil.disk_usage(layout.root)
    free_mb = usage.free // (1 << 20)
    if free_mb < min_free_mb:
        raise AgentFailure("agent", f"only {free_mb} MB free under {layout.root} on the target",
                           "free some space there (orch checkpoints purge) or move [paths] root")
    return {"python": ".".join(map(str, sys.version_info[:3])), "executable": sys.executable, "tmux": version,
            "free_mb": free_mb, "gpus": gpus(), "hostname": os.uname().nodename}
