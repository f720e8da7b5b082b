"""The wheel built as users get it: from a copy of a checkout's shipped files, so the build leaves no ``build/`` or
egg-info in the checkout. Used by the packaging tests and by the benchmarks that measure orch as users install it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

SHIPPED = ("pyproject.toml", "README.md", "orchestrator")


def build_wheel(source: Path, work: Path, python: str = sys.executable, timeout: float = 300) -> Path:
    """The wheel of the checkout at ``source``, built under ``work`` (its ``src/`` copy and ``dist/``)."""
    src, dist = work / "src", work / "dist"
    src.mkdir(parents=True)
    for name in SHIPPED:
        if (source / name).is_dir():
            shutil.copytree(source / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(source / name, src / name)
    proc = subprocess.run([python, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)],
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"pip wheel exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return next(dist.glob("orch-*.whl"))
