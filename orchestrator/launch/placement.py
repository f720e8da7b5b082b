"""Placement by GPUs: ``orch deploy --gpus N`` picks the machine with N free GPUs and the GPUs on it.

A GPU is free when nvidia-smi shows no compute process on it. One held only by this project's own run on
that machine counts as freed, since the launch stops that run before it starts the new one; a machine
with N truly free GPUs is still preferred to one where the launch must first stop a run. ``choose`` is
pure (the machines' reports in, a choice or a refusal out); ``place`` asks the machines, in parallel.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import ConflictError, InputError


@dataclass
class Choice:
    key: Any  # the candidate chosen (as the caller named it)
    gpus: list[dict]  # [{"index": 0, "uuid": "GPU-…"}, …], N of them
    reason: str
    target: Any = None
    others: list[str] = field(default_factory=list)


def _own(gpu: dict, project: str) -> bool:
    """Held only by runs of ``project`` (which the launch stops first)."""
    holders = gpu.get("holders") or []
    return bool(holders) and all((h.get("owner") or {}).get("project") == project for h in holders)


def _summary(label: str, report: dict) -> str:
    """``CT 200: 1 of 2 free (GPU 1: exp 3 (tinylm))``, or why the machine could not be used."""
    if report.get("error") and not report.get("gpus"):
        return f"{label}: {report['error']}"
    gpus = report.get("gpus") or []
    free = [g for g in gpus if g.get("free")]
    held = [f"GPU {g['index']}: {g['use']}" for g in gpus if not g.get("free")]
    return f"{label}: {len(free)} of {len(gpus)} free" + (f" ({'; '.join(held)})" if held else "")


def choose(reports: list[tuple[Any, str, dict]], n: int, project: str) -> Choice:
    """The machine (``(key, label, report)``, in the order named) to give ``n`` GPUs, and which ones."""
    if n < 1:
        raise InputError(f"--gpus {n}: a run needs at least one GPU", hint="give --gpus 1 or more")
    best = None
    for rank, (key, label, report) in enumerate(reports):
        gpus = sorted(report.get("gpus") or [], key=lambda g: g["index"])
        free = [g for g in gpus if g.get("free")]
        own = [g for g in gpus if _own(g, project)]
        if len(free) >= n:
            score, picked, why = (0, rank), free[:n], f"{len(free)} of {len(gpus)} GPUs free"
        elif len(free) + len(own) >= n:
            picked = (free + own)[:n]
            runs = sorted({g["use"] for g in picked if not g.get("free")})
            score, why = (1, rank), (f"{len(free)} of {len(gpus)} GPUs free, and {', '.join(runs)} of this project "
                                     "holds the rest: this launch stops it first")
        else:
            continue
        if best is None or score < best[0]:
            best = (score, key, label, picked, why)
    if best is None:
        detail = "; ".join(_summary(label, report) for _, label, report in reports)
        where = "the machine" if len(reports) == 1 else f"any of the {len(reports)} machines"
        raise ConflictError(f"no {n} free GPU{'s' if n > 1 else ''} on {where}: {detail}",
                            hint="free them (orch status, orch stop), or orch deploy with fewer --gpus or "
                                 "other machines (--ct, --target, --pool)")
    _, key, label, picked, why = best
    chosen = [{"index": g["index"], "uuid": g.get("uuid")} for g in picked]
    indices = ",".join(str(g["index"]) for g in chosen)
    reason = f"{label}: {why}; the run gets GPU{'s' if n > 1 else ''} {indices}"
    others = [_summary(lb, rep) for k, lb, rep in reports if k != key]
    return Choice(key=key, gpus=chosen, reason=reason, others=others)


def candidates(settings, names: list[str] | None, cts: list[int] | None,
               pool: str | None) -> list[tuple[str | None, int | None]]:
    """The machines to choose among, as ``(target name, CT id)``: the flags' (``--target`` first), else the
    pool's members, else the one the current target names (``(None, None)``)."""
    if pool is not None:
        if names or cts:
            raise InputError("--pool names the machines already", hint="give --pool, or --ct/--target, not both")
        if pool not in settings.pools:
            known = ", ".join(sorted(settings.pools)) or "none configured"
            raise InputError(f"no pool {pool!r} in orch.toml (pools: {known})",
                             hint=f"add [pools.{pool}] members = [\"target\", 201] to orch.toml")
        return [(m, None) if isinstance(m, str) else (None, m) for m in settings.pools[pool].members]
    groups = [n for n in names or [] if n in settings.targets and settings.targets[n].kind == "group"]
    if groups:
        members = ", ".join(settings.targets[groups[0]].members)
        raise InputError(f"target {groups[0]!r} is a group (a job over its nodes); --gpus places one run on one "
                         "machine", hint=f"name the machines to choose among: --target for each of {members}")
    out: list[tuple[str | None, int | None]] = [(n, None) for n in names or []] + [(None, c) for c in cts or []]
    return out or [(None, None)]


def place(settings, wanted: list[tuple[str | None, int | None]], n: int,
          resolve: Callable[[str | None, int | None], Any]) -> Choice:
    """Ask each machine for its GPUs (in parallel) and choose; the Choice carries the resolved target."""
    from ..reach import gpu_facts

    targets: dict[int, Any] = {}

    def asker(i: int, name: str | None, ct: int | None) -> Callable[[], dict]:
        def go() -> dict:
            targets[i] = resolve(name, ct)
            return gpu_facts.ask(settings, targets[i])
        return go

    answers = gpu_facts.survey([(i, asker(i, name, ct)) for i, (name, ct) in enumerate(wanted)],
                               gpu_facts.survey_timeout(settings))
    reports = []
    for i, (name, ct) in enumerate(wanted):
        label = targets[i].label if i in targets else (name or (f"CT {ct}" if ct is not None else "the target"))
        reports.append((i, label, answers[i]))
    choice = choose(reports, n, settings.project.name)
    choice.target = targets[choice.key]
    return choice


def apply(launch, choice: Choice) -> None:
    """The run sees exactly the chosen GPUs, numbered as nvidia-smi numbers them (PCI bus order)."""
    launch.env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    launch.env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g["index"]) for g in choice.gpus)
    launch.gpus = choice.gpus
