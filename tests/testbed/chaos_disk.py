"""The chaos loop's full disk: CT 200's workspace on a small filesystem of its own, filled to 100% for a moment.

The testbed CT's rootfs is an overlay whose upper layer is a folder on the host's own disk (``lxc.py``): it has
no size of its own, so filling it would fill the host. Instead the loop mounts a tmpfs of ``SIZE`` over the
workspace inside the CT (gone at the CT's next reset), and fills it with one file that orch does not own::

    small_workspace(ct)   # once, before the first command: /workspace is a 128 MB filesystem
    fill(ct)              # until the kernel says ENOSPC: every write under the target's root fails
    free(ct)              # the filler goes; nothing else is touched
"""

from __future__ import annotations

from .chaos_clones import WORKSPACE

SIZE = "128m"  # RAM at most, only while full; far more than the chaos runs' few MB of files
FILLER = f"{WORKSPACE}/.chaos-filler"


def small_workspace(ct) -> None:
    ct.attach("sh", "-c", f"mkdir -p {WORKSPACE} && (mountpoint -q {WORKSPACE} || "
                          f"mount -t tmpfs -o size={SIZE},mode=0755 chaos-workspace {WORKSPACE})")


def fill(ct) -> int:
    """Fill the workspace's filesystem; the bytes it still had free afterwards (0 when full)."""
    ct.attach("sh", "-c", f"dd if=/dev/zero of={FILLER} bs=1M 2>/dev/null; "
                          f"dd if=/dev/zero of={FILLER} bs=4k oflag=append conv=notrunc 2>/dev/null; true")
    return free_bytes(ct)


def free_bytes(ct) -> int:
    proc = ct.attach("python3", "-c", f"import os; s = os.statvfs({WORKSPACE!r}); print(s.f_bavail * s.f_frsize)")
    return int(proc.stdout.decode().strip())


def free(ct) -> None:
    ct.attach("rm", "-f", FILLER)
