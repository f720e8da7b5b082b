"""Where each experiment's checkpoints live: one folder per lineage, none inside another's.

The configured folder (``[paths] checkpoints``, e.g. ``/w/checkpoints/tinylm``) belongs to the project's
lineage: plain deploys and restarts, and the supervisor's automatic restarts, resume from it. A run that runs
beside others (a sweep's variant, ``deploy --beside``) gets a folder of its own, where the folder's trash goes
and for the same reason (a rename never crosses filesystems):

    /w/checkpoints/tinylm            the lineage          /w/checkpoints/tinylm.trash/   its trash
    /w/checkpoints/tinylm@exp29      experiment 29's      /w/checkpoints/tinylm@exp29.trash/

or, when the configured folder is a mount point of its own, inside it, hidden, never part of its contents::

    /w/checkpoints/tinylm/.orch-exp/exp29

Project names cannot hold ``@``, so no project's folder is ever another's variant. Older orch nested the
variants in the lineage's folder (``tinylm/exp29``): ``legacy_names`` tells every reader of the folder to
pass over them until ``ckpt_move`` has moved them.
"""

from __future__ import annotations

import os
import re

from ..layout import Layout, read_json
from .trash_location import VARIANTS, is_mount_point

LEGACY = re.compile(r"exp(\d+)(\.trash)?")
MARK = "@exp"


def prefix(norm: str) -> str:
    """What ``exp<id>`` is appended to for a variant of the configured folder ``norm``."""
    if os.path.isdir(norm) and is_mount_point(norm):
        return os.path.join(norm, VARIANTS) + "/"
    return norm + "@"


def variant(norm: str, exp_id: int) -> str:
    return f"{prefix(norm)}exp{int(exp_id)}"


def is_variant_of(path: str, configured: str) -> bool:
    """Whether ``path`` is the folder of one of ``configured``'s variants (in either of the two places)."""
    norm, conf = os.path.normpath(path), os.path.normpath(configured)
    for base in (conf + "@", os.path.join(conf, VARIANTS) + "/"):
        if norm.startswith(base) and re.fullmatch(r"exp\d+", norm[len(base):]):
            return True
    return False


def variants(norm: str) -> list[dict]:
    """The variant folders of ``norm`` there are now, by experiment number: ``{"exp": 29, "path": ...}``."""
    found = []
    parent, base = os.path.split(norm)
    for folder, start in ((parent, base + MARK), (os.path.join(norm, VARIANTS), "exp")):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            num = name[len(start):]
            full = os.path.join(folder, name)
            if name.startswith(start) and num.isdigit() and os.path.isdir(full) and not os.path.islink(full):
                found.append({"exp": int(num), "path": full})
    return sorted(found, key=lambda v: v["exp"])


def _named(layout: Layout, norm: str) -> dict[str, list[dict]]:
    """Legacy variant folders ``norm/exp<N>`` that a run record or a queued launch names: child name ->
    ``{"run_dir", "queued"}`` of each."""
    users: dict[str, list[dict]] = {}
    records = []
    try:
        records = [(os.path.join(layout.runs, n), os.path.join(layout.runs, n, "experiment.json"), False)
                   for n in os.listdir(layout.runs)]
    except OSError:
        pass
    queue = os.path.join(layout.root, "queue")
    try:
        for project in os.listdir(queue):
            pdir = os.path.join(queue, project)
            records += [(None, os.path.join(pdir, n), True) for n in os.listdir(pdir) if n.endswith(".json")]
    except OSError:
        pass
    for run_dir, path, queued in records:
        data = read_json(path, {}) or {}
        exp = (data.get("experiment") if queued else data) or {}
        ckpt = str(exp.get("checkpoints") or "") if isinstance(exp, dict) else ""
        if ckpt and os.path.dirname(os.path.normpath(ckpt)) == norm:
            name = os.path.basename(os.path.normpath(ckpt))
            if LEGACY.fullmatch(name) and not name.endswith(".trash"):
                users.setdefault(name, []).append({"run_dir": run_dir, "queued": queued})
    return users


def legacy(layout: Layout, norm: str) -> dict[str, list[dict]]:
    """The children of ``norm`` that are an older orch's variant folders (``exp<N>``, named by a run record or a
    queued launch) or their trash (``exp<N>.trash``), with who names them; a folder with no such child costs
    one listing."""
    try:
        children = [c for c in os.listdir(norm) if LEGACY.fullmatch(c)]
    except OSError:
        return {}
    if not children:
        return {}
    named = _named(layout, norm)
    return {c: named[c.removesuffix(".trash")] for c in children if c.removesuffix(".trash") in named}


def legacy_names(layout: Layout, norm: str) -> frozenset[str]:
    """The children of ``norm`` no reader of the lineage's folder may count, move, pull or resume from."""
    return frozenset(legacy(layout, norm))


def now_at(run_dir: str, path: str) -> str:
    """The folder a run's checkpoints are in now, for ``path`` as the controller recorded it: an older orch's
    ``F/exp<N>`` is ``F@exp<N>`` (or ``F/.orch-exp/exp<N>``) once moved, as the run's record on the target says."""
    norm = os.path.normpath(path)
    parent, name = os.path.split(norm)
    if not LEGACY.fullmatch(name) or name.endswith(".trash"):
        return path
    recorded = str((read_json(os.path.join(run_dir, "experiment.json"), {}) or {}).get("checkpoints") or "")
    return recorded if recorded and is_variant_of(recorded, parent) else path
