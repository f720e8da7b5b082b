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


def prune_agents(layout: Layout, current: str, min_age_s: float = 86400.0) -> list:
    """Remove agent versions left by older orch releases: never the current one, one used by a live
    run (its PYTHONPATH points there), or one younger than a day (another controller may use it)."""
    import time

    from .layout import read_json
    from .runs import alive_runs

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
            "free_mb": free_mb, "gpus": gpus(), "hostname": os.uname().nodename,
            "pruned_agents": prune_agents(layout, os.path.abspath(sys.argv[0]))}
