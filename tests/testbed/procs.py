"""Peak memory of processes, on the host or in a container (whose processes the host's /proc shows too)."""

from __future__ import annotations

import os
from pathlib import Path


def peak_kb(pid: int) -> int:
    """The process's peak resident set (VmHWM) in KiB, 0 when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def pids_running(needle: str) -> list[int]:
    """The processes whose command line contains ``needle``."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if needle.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    out.append(int(entry))
            except OSError:
                continue
    return out
