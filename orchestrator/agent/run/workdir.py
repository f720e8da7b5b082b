"""A run's working folder: ``runs/<key>/work``, the revision's files as hard links, everything else the run's.

The revision stays read-only and gets no new file; the run's command starts in its work folder, so what it
writes beside its code (``out/``, ``wandb/``, the ``__pycache__/`` of its own modules) lands in its run folder
and goes with it. No ``PYTHONPYCACHEPREFIX`` is set: a prefix of the run's own would make every run compile
every module it imports again (stdlib, numpy, torch), for seconds; installed packages keep their caches.
Building it costs one link per file, no copy of any content, however large the tree. Folders are the run's
(0755); files keep the revision's read-only modes. A hard link shares the blob's inode: a run that can write
to a read-only file anyway (root) and writes into one changes the blob, which ``gc`` detects and reports
(``revisions.audit``). A filesystem that refuses the link (none in orch's root normally) gets a copy.

    build(layout, run_dir, revision)  -> "<root>/runs/<key>/work"
"""

from __future__ import annotations

import os
import shutil

from .. import journal
from ..layout import Layout
from ..protocol import AgentFailure
from ..store.revisions import MANIFEST, listed_files

WORK = journal.WORK  # the one name journal.only_launch allows beside the journal


def work_dir(run_dir: str) -> str:
    return os.path.join(run_dir, WORK)


def for_step(layout: Layout, exp_id: int, registry: str | None, revision: str) -> str:
    """The work folder of this launch's new run, for a playbook step (``shell``): made now when the step comes
    before the start, which finds it and keeps it, so what the step wrote there is the run's; the run's own
    once it has started."""
    run_dir = layout.run_dir(exp_id, registry)
    if os.path.isdir(work_dir(run_dir)):
        return work_dir(run_dir)
    if not os.path.isdir(layout.revision(revision)):
        raise AgentFailure("notfound", f"revision {revision} is not on the target", "deploy again to push it")
    if os.path.lexists(run_dir) and not journal.only_launch(run_dir):
        raise AgentFailure("safety", f"run folder {run_dir} already exists",
                           "give each project its own [paths] root, or remove the stale run folder")
    os.makedirs(run_dir, exist_ok=True)
    return build(layout, run_dir, revision)


def build(layout: Layout, run_dir: str, revision: str) -> str:
    """Make ``run_dir/work`` from ``revision``; an existing one (a resumed run) is kept as the run left it."""
    work = work_dir(run_dir)
    if os.path.isdir(work):
        return work
    rev_dir = layout.revision(revision)
    files = listed_files(rev_dir)
    rels = [f["path"] for f in files] if files is not None else _walk(rev_dir)
    tmp = os.path.join(run_dir, ".tmp-" + WORK)  # a start cut half-way leaves no half-built work folder
    if os.path.isdir(tmp):
        shutil.rmtree(tmp)
    os.mkdir(tmp, 0o755)
    try:
        _fill(tmp, rev_dir, revision, rels)
        os.rename(tmp, work)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return work


def _fill(tmp: str, rev_dir: str, revision: str, rels: list[str]) -> None:
    made = {tmp}
    for rel in rels:
        if os.path.isabs(rel) or os.path.normpath(rel).startswith(".."):
            raise AgentFailure("input", f"revision {revision} lists {rel!r}, which escapes its folder")
        dest = os.path.join(tmp, rel)
        parent = os.path.dirname(dest)
        if parent not in made:
            os.makedirs(parent, 0o755, exist_ok=True)
            made.add(parent)
        source = os.path.join(rev_dir, rel)
        try:
            os.link(source, dest)
        except OSError as exc:
            if not os.path.isfile(source):
                raise AgentFailure("agent", f"revision {revision} lacks {rel} ({exc.strerror})",
                                   "deploy again: the revision is rebuilt from what is pushed") from exc
            shutil.copy2(source, dest)


def _walk(rev_dir: str) -> list[str]:
    """The files of a revision without a readable manifest (made by an older orch)."""
    out = []
    for base, _dirs, names in os.walk(rev_dir):
        for name in names:
            rel = os.path.relpath(os.path.join(base, name), rev_dir)
            if rel != MANIFEST:
                out.append(rel)
    return out
