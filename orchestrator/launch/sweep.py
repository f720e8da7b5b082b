"""``orch sweep``: the cartesian product of ``--set key=a,b,c`` values, launched as the variants of one sweep.

Each variant is a ``deploy --queue`` (``queueing``; with ``--gpus K --beside``, queued beside: the target's queue
starts as many at once as have K free GPUs each) with its settings overridden, its budget in its environment
(``ORCH_MAX_STEPS``, ``ORCH_MAX_MINUTES``: the target's supervisor ends it gracefully there, so the script needs
no change) and the sweep's id on its row; variants are spread over the named targets in turn and queue behind
each other on each, so a machine goes from one to the next with no controller connected.

    variants(["batching.strategy=sorted,shuffle", "run.lr=1e-4,3e-4"])
    -> [{"batching.strategy": "sorted", "run.lr": "1e-4"}, {"batching.strategy": "sorted", "run.lr": "3e-4"}, ...]
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import InputError
from . import space

MAX_VARIANTS = space.MAX_VARIANTS


def variants(sets: list[str]) -> list[dict[str, str]]:
    """Every combination of the ``--set`` values, the first key varying slowest; a key given twice is refused,
    and so is a range (``loguniform(1e-5,1e-2)``: a search, which the conductor runs)."""
    chosen = space.plan(sets)
    if chosen.search:
        raise InputError("a grid sweep takes lists of values; this one has a range",
                         hint="give --trials N to search it")
    return space.grid(chosen.space)


def budget_env(steps: int | None, minutes: float | None) -> dict[str, str]:
    if steps is not None and minutes is not None:
        raise InputError("give --steps or --minutes, not both", hint="a variant ends at its one budget")
    if steps is None and minutes is None:
        raise InputError("a sweep needs a budget for each variant: --steps N or --minutes M",
                         hint="e.g. orch sweep --set batching.strategy=sorted,shuffle --steps 200")
    return {"ORCH_MAX_STEPS": str(steps)} if steps is not None else {"ORCH_MAX_MINUTES": f"{minutes:g}"}


def check_beside(gpus: int | None, beside: bool) -> int | None:
    """The GPUs each variant gets beside the others: ``--gpus K`` alone spreads the variants over the free GPUs
    (``--beside`` is implied: a sweep never replaces its own variants); ``--beside`` alone needs a K."""
    if beside and gpus is None:
        raise InputError("--beside runs the variants side by side on free GPUs, and needs to know how many each gets",
                         hint="give --gpus K with --beside (orch sweep ... --gpus 1 --beside)")
    return gpus


def new_id() -> str:
    """``s`` and 6 hex digits: short enough to type (orch sweep show s1a2b3c)."""
    return "s" + os.urandom(3).hex()


@dataclass
class Launched:
    sweep: str
    rows: list[dict] = field(default_factory=list)  # one per variant: id, settings, target, status, position


def queue_one(settings, target, registry, *, sweep: str, env: dict[str, str], message: str,
              echo: Callable[[str], None], start_idle: bool = True, beside_gpus: int | None = None):
    """One variant handed to the target's queue (started at once when ``start_idle`` and nothing runs there):
    the experiment and its place in the queue."""
    from . import prepare, queueing
    from .operations import execute

    plan = prepare.deploy(settings, target, message=message, clean=False, purge=False, yes=True, confirm=None,
                          echo=echo)
    plan.env = {**plan.env, **env}
    plan.sweep = sweep
    plan = queueing.queued(plan, start_idle=start_idle)
    if beside_gpus is not None:  # started by the target's queue on the free GPUs, as many at once as fit
        plan.beside = {"gpus": beside_gpus, "total": target.spec.gpus}
    done = execute(plan, registry)
    assert done.experiment is not None
    return done.experiment, (done.queue or {}).get("position")


def launch(sets: list[str], steps: int | None, minutes: float | None, targets: list[Any],
           settings_for: Callable[[list[str]], Any], registry, *, echo: Callable[[str], None],
           message: str | None = None, base_sets: list[str] | None = None,
           beside_gpus: int | None = None) -> Launched:
    """Queue every variant (nothing is changed anywhere before every variant's settings have loaded)."""
    from . import queueing

    combos = variants(sets)
    env = budget_env(steps, minutes)
    if not targets:
        raise InputError("a sweep needs a target", hint="name one with --target or --ct, or orch use one")
    configs = [settings_for([*(base_sets or []), *(f"{k}={v}" for k, v in combo.items())]) for combo in combos]
    sweep = new_id()
    out = Launched(sweep)
    # every variant of a target is queued before its first starts: none runs while the rest are being queued
    for i, (combo, settings) in enumerate(zip(combos, configs)):
        target = targets[i % len(targets)]
        said = ", ".join(f"{k}={v}" for k, v in combo.items())
        exp, position = queue_one(settings, target, registry, sweep=sweep, env=env, echo=echo,
                                  message=f"sweep {sweep}: {said}" + (f" ({message})" if message else ""),
                                  start_idle=i + len(targets) >= len(combos), beside_gpus=beside_gpus)
        out.rows.append({"id": exp.id, "settings": combo, "target": target.label, "status": exp.status,
                         "position": position})
    # each target's last queueing started its first variant: the rows and positions as the targets have them now
    for target in {t.label: t for t in targets[:len(combos)]}.values():
        where = {e["id"]: e["position"] for e in queueing.listing(configs[0], target, registry) if e.get("mine")}
        for row in out.rows:
            if row["target"] == target.label:
                row["status"] = registry.get(row["id"]).status
                row["position"] = where.get(row["id"])
    return out
