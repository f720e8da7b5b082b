"""Where a checkpoint folder's trash lives: always on the folder's own filesystem, so a clean is a rename.

A plain folder ``/w/checkpoints`` keeps its trash beside it, in ``/w/checkpoints.trash/``. A folder that
is a mount point of its own (a Proxmox ``mpN`` volume, NFS, a bind mount) cannot: ``rename(2)`` out of it
fails with EXDEV. Its trash is a hidden folder inside it, ``/w/checkpoints/.orch-trash/``, which is
never part of the folder's contents (nor are the experiments' own folders kept there, ``.orch-exp/``:
``ckpt_layout``); nor is the ``lost+found`` an ext4 volume has at its root (fsck's folder, not a checkpoint). Listing, restoring and purging look in both places, so entries made before
the folder became a mount point are still found.
"""

from __future__ import annotations

import os
import re

from ..protocol import AgentFailure

INSIDE = ".orch-trash"
VARIANTS = ".orch-exp"  # the variants' own folders, inside a folder that is a mount point (ckpt_layout)
LOST_FOUND = "lost+found"


def _mount_points() -> set[str]:
    """Mount points of this mount namespace; bind mounts included, which ``os.path.ismount`` misses."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return set()
    points = set()
    for line in lines:
        fields = line.split(" ")
        if len(fields) > 4:  # octal escapes: \040 space, \011 tab, \012 newline, \134 backslash
            points.add(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4]))
    return points


def is_mount_point(path: str) -> bool:
    return os.path.ismount(path) or os.path.normpath(path) in _mount_points()


def not_contents(norm: str) -> frozenset[str]:
    """Children of the folder that are never checkpoints, so never counted, listed or moved."""
    return frozenset((INSIDE, VARIANTS, LOST_FOUND)) if is_mount_point(norm) else frozenset((INSIDE, VARIANTS))


def beside(norm: str) -> str:
    return norm + ".trash"


def inside(norm: str) -> str:
    return os.path.join(norm, INSIDE)


def trash_dir(norm: str) -> str:
    """Where new entries of the folder ``norm`` go."""
    return inside(norm) if os.path.isdir(norm) and is_mount_point(norm) else beside(norm)


def trash_dirs(norm: str) -> list[str]:
    """Every place entries of ``norm`` may be, the one new entries go to first."""
    first = trash_dir(norm)
    return [first] + [d for d in (inside(norm), beside(norm)) if d != first]


def check_movable(norm: str) -> str:
    """Refuse, touching nothing, when the folder's contents could not be renamed into its trash."""
    tdir = trash_dir(norm)
    if not os.path.isdir(norm):
        return tdir  # nothing to move
    if os.path.islink(tdir):
        raise AgentFailure("safety", f"the checkpoint trash {tdir} is a symlink to {os.path.realpath(tdir)}",
                           f"remove the link; orch creates {tdir} itself, on the same filesystem as {norm}")
    existing = tdir if os.path.lexists(tdir) else os.path.dirname(tdir)
    if not os.path.isdir(existing):
        raise AgentFailure("safety", f"the checkpoint trash {tdir} is not a folder",
                           f"move it out of the way; orch keeps {norm}'s trash there")
    if os.stat(existing).st_dev != os.stat(norm).st_dev or (existing == tdir and is_mount_point(tdir)):
        raise AgentFailure("safety", f"the checkpoint trash {tdir} is on another filesystem than {norm}: "
                           "cleaning would fail halfway (a rename cannot cross filesystems)",
                           f"unmount {tdir}, or make {norm} a mount point of its own (its trash then lives "
                           f"inside it, in {INSIDE}/)")
    for folder, why in ((existing, "create the trash entry"), (norm, "move the checkpoints out of it")):
        if not os.access(folder, os.W_OK | os.X_OK):
            raise AgentFailure("safety", f"{folder} is not writable: orch could not {why}",
                               f"fix its permissions or mount options (read-only?) before cleaning {norm}")
    return tdir
