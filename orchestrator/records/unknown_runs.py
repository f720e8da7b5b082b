"""Rows that say ``running`` of a run their target does not know: what ``orch stop -e N`` settles, with why,
instead of answering "was not running" and leaving the row running for good.

Two ways there: the machine holds no run folder of N for this registry (N was started on another machine that
answered at the CT's address, or its folder was removed), or the CT is stopped (its runs ended with it; one
set to resume at boot is brought back by the next status, as any ``lost`` run is).

    settle(registry, target, [23], known_runs)    # -> [(23, "CT 350 has no run of experiment 23 ...")]
"""

from __future__ import annotations

import posixpath
import time

from ..errors import NotFoundError
from .experiments import Registry
from .reconcile import belongs, is_job

LIVE = ("running",)  # a launching row has its launcher, a queued one no folder yet: neither is settled here


def _row(registry: Registry, target, project: str, exp_id: int):
    try:
        exp = registry.get(exp_id)
    except NotFoundError:
        return None
    if exp.status not in LIVE or not belongs(exp, target, project) or is_job(exp):
        return None
    return exp


def settle(registry: Registry, target, project: str, ids: list[int], known: list[dict],
           stopped: list[dict]) -> list[tuple[int, str]]:
    """Each row of ``ids`` that still reads running although the target reported no run of it (``known``: its
    ``status`` of those ids), nor stopped one: recorded ``lost``, with why. Returns (id, why) of each."""
    there = {int(r["id"]) for r in known if registry.owns(r)}
    there |= {int(r["id"]) for r in stopped if registry.owns(r)}
    out = []
    for exp_id in ids:
        exp = None if exp_id in there else _row(registry, target, project, exp_id)
        if exp is None:
            continue
        key = registry.run_registry(exp_id)
        folder = posixpath.join(target.root, "runs", f"{key}-{exp_id}" if key else str(exp_id))
        why = (f"{target.label} has no run of experiment {exp_id} (no {folder}): it was never started there, or "
               "its folder was removed; settled by orch stop")
        registry.update(exp_id, status="lost", ended=time.time(), end_reason=why)
        out.append((exp_id, why))
    return out


def settle_stopped_ct(registry: Registry, target, project: str, exp_id: int, why: str) -> str | None:
    """Row ``exp_id`` of a CT that is stopped (``why``: what the API said): recorded ``lost``; the reason, or None
    when the row was not running there."""
    exp = _row(registry, target, project, exp_id)
    if exp is None:
        return None
    reason = f"{why.split('; ')[0]}: its run ended with it (settled by orch stop)"  # what answered: said, not kept
    registry.update(exp_id, status="lost", ended=time.time(), end_reason=reason)
    return reason
