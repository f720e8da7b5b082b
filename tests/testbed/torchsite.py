"""torch in the testbed's containers without a network inside them (MULTINODE.md, option B).

``ensure_site`` installs ``torch==2.13.0+cpu`` and numpy once into a host folder with pip ``--target``
(cached beside the base image; ≈ 800 MB), its modules compiled there (the CTs see the folder read-only, so a
python3 in a CT could never write them, and would compile torch again at each import); ``mount`` bind-mounts it
read-only at /opt/torchsite in a CT and names it in a ``.pth`` file. A bind mount is set in the CT's config, so
the CT restarts (≈ 0.5 s); the next reset of the CT drops the ``.pth`` and ``unmount`` drops the config line.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.testbed.lxc import CACHE_DIR, Container

TORCH = "torch==2.13.0+cpu"
SITE = CACHE_DIR / "torchsite-2.13.0-cpu"
MOUNT = "opt/torchsite"
PTH = "usr/lib/python3/dist-packages/orch-torchsite.pth"


def ensure_site(site: Path = SITE) -> Path:
    """The host folder holding torch and numpy; installed with pip the first time (renamed when complete).
    The suite's two groups may both need it first: the second waits for the first's install."""
    import fcntl

    if (site / "torch" / "__init__.py").exists():
        return site
    site.parent.mkdir(parents=True, exist_ok=True)
    with open(site.with_name(site.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (site / "torch" / "__init__.py").exists():
            return site
        tmp = site.with_name(site.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-compile", "--target", str(tmp), TORCH,
                        "numpy"], check=True, timeout=1800)
        # for the CTs' python3, of this one's minor version (a module that does not compile is left to its import)
        subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", str(tmp)], stdout=subprocess.DEVNULL,
                       timeout=1800)
        tmp.rename(site)
    return site


def _entry(site: Path) -> str:
    return f"lxc.mount.entry = {site} {MOUNT} none bind,ro,create=dir 0 0"


def mount(ct: Container, site: Path = SITE) -> None:
    """Make ``import torch`` work in ``ct`` (stopped, configured, started again)."""
    config = ct.dir / "config"
    text = config.read_text()
    ct.stop()
    if _entry(site) not in text:
        config.write_text(text.rstrip("\n") + "\n" + _entry(site) + "\n")
    pth = ct.delta / PTH
    pth.parent.mkdir(parents=True, exist_ok=True)
    pth.write_text("/" + MOUNT + "\n")
    ct.start()


def unmount(ct: Container, site: Path = SITE) -> None:
    """Drop the config line (the mount goes with the CT's next restart or reset)."""
    config = ct.dir / "config"
    config.write_text(config.read_text().replace(_entry(site) + "\n", ""))
