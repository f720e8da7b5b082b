"""Runs of one project side by side on one machine (``deploy --beside``): which are live, and which a bare
command acts on.

A bare ``status``, ``logs``, ``stop`` or ``attach`` acts on the latest live run (the highest id, as
``Registry.latest`` orders them) and, when several run, says so on stderr; ``-e ID`` names another.
Read from the registry's rows, brought up to date by the command's own reconcile.

    live(registry, target, "tinylm") -> [Experiment 7, Experiment 5]   (newest first)
    note("tinylm", [7, 5], 7) -> "2 runs of tinylm here; acting on the latest, experiment 7 (-e ID names another)"
"""

from __future__ import annotations

from .experiments import Experiment, Registry


def live(registry: Registry, target, project: str) -> list[Experiment]:
    """This registry's running experiments of ``project`` on the target's machine, newest first."""
    rows = registry.list(machine=target.machine, status="running", limit=200) if target.machine else \
        registry.list(target=target.name, status="running", limit=200)
    return [e for e in rows if e.project == project and not e.nodes]


def note(project: str, ids: list[int], acting: int | None) -> str | None:
    """What a bare command says when several runs of the project are live here (None: one or none)."""
    if len(ids) < 2 or acting is None:
        return None
    return (f"{len(ids)} runs of {project} here; acting on the latest, experiment {acting} "
            "(-e ID names another)")
