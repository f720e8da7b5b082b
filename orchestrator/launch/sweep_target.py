"""A searching sweep conducted on its one target (``orch sweep --on-target``), the controller's side.

The controller asks the first trial and queues it as any trial is queued (its revision pushed, its experiment
recorded), but does not let the queue start it; it reserves the experiment numbers of every later trial in the
registry (``Registry.reserve``), and hands the target the study, the spec and that first entry as every trial's
template (``agent/queue/search.py``). From then on the conductor runs there, kept alive as the target keeps its
queue; the controller only reads: ``fetch`` copies the study back over the project's ``.orch/sweeps/<id>.db`` and
records each trial the target queued as an experiment of the sweep (the number reserved for it, the first trial's
row for its revision and settings), then brings the rows up to date as any command does (``reconcile``).

    check(space, spec, targets)     # what a conductor on the target cannot do, refused before anything
    start(settings, target, spec, space, registry, settings_for) -> pid of the target's conductor
    fetch(settings, target, sweep, registry) -> {"conductor": pid or None, "ended": ...}
"""

from __future__ import annotations

import base64
import os
import time
from dataclasses import asdict
from typing import Any, Callable

from ..errors import InputError, OrchError
from ..reach.agent_client import Op

ENV = "project.env."
COPIED = ("project", "target", "target_info", "machine", "revision", "revision_files", "git_commit", "git_dirty",
          "git_diff", "command", "config", "batching", "batching_plan", "env")


def check(space: dict, spec, targets: list) -> None:
    """A trial on the target is its first trial's queue entry with other values: only ``project.env`` can vary."""
    from . import space as spaces

    hint = "drop --on-target: the controller conducts the sweep, launching each trial as a deploy"
    if len(targets) != 1:
        raise InputError("--on-target conducts a sweep on its one target, and this one names "
                         f"{len(targets)}", hint=hint)
    if targets[0].spec.kind == "slurm":
        raise InputError("--on-target is for a machine that keeps its own queue, not a Slurm cluster", hint=hint)
    if spec.rung_by != "steps":
        raise InputError("--on-target measures rungs in steps (--rung-by tokens needs the controller)", hint=hint)
    varied = [k for k, d in space.items() if not (isinstance(d, spaces.Choice) and len(d.values) == 1)]
    other = [k for k in varied if not k.startswith(ENV)]
    if other:
        raise InputError(f"--on-target searches values of the run's environment (project.env.*); {', '.join(other)} "
                         "would need a launch of its own for each trial", hint=hint)


def start(settings, target, spec, space: dict, registry, settings_for: Callable[[list[str]], Any],
          study_open: Callable[..., Any]) -> int | None:
    """The first trial queued (not started), the later trials' numbers reserved, the sweep handed to the target;
    returns the pid of the conductor there."""
    from ..records.reconcile import client_for
    from . import conductor, queueing
    from . import space as spaces
    from . import study as studies
    from .sweep import queue_one

    found = conductor.start(settings.state_dir, spec, space, study_open)
    number, params = found.ask(space)
    shown = [k for k, d in space.items() if not (isinstance(d, spaces.Choice) and len(d.values) == 1)]
    said = ", ".join(f"{k}={_short(v)}" for k, v in params.items() if k in shown)
    message = f"sweep {spec.sweep}: trial {number}: {said}" + (f" ({spec.message})" if spec.message else "")
    exp, _ = queue_one(settings_for([spaces.as_set(k, v) for k, v in params.items()]), target, registry,
                       sweep=spec.sweep, env={"ORCH_MAX_STEPS": str(spec.steps), "ORCH_SWEEP_TRIAL": str(number)},
                       message=message, echo=lambda _m: None, start_idle=False, beside_gpus=spec.gpus)
    for key, value in (("experiment", exp.id), ("budget_steps", spec.steps), ("message", message),
                       ("checkpoints", exp.checkpoints), ("queued", time.time())):
        found.trial_attr(number, key, value)
    reserved = [registry.reserve() for _ in range(spec.trials - 1)]
    wire = {"template": exp.id, "registry": registry.run_registry(exp.id), "reserved": reserved,
            "space": studies.distributions(space), "shown": shown,
            "grid": {k: list(d.values) for k, d in space.items() if isinstance(d, spaces.Choice)},
            "stop_timeout": settings.run.stop_timeout, "term_timeout": settings.run.term_timeout,
            **{k: v for k, v in asdict(spec).items() if k in ("trials", "sampler", "prune", "metric", "mode", "steps",
                                                            "min_steps", "parallel", "seed", "message")}}
    found.set_attr("on_target", {"label": target.label, "reserved": reserved})
    from .conductor import paths

    data = paths(settings.state_dir, spec.sweep)["db"].read_bytes()
    client = client_for(settings, target)
    try:
        done = client.call([Op("sweep_start", {"project": settings.project.name, "sweep": spec.sweep, "spec": wire,
                                               "study": base64.b64encode(data).decode()})],
                           what="hand the sweep to its target")[0]
    except OrchError as exc:
        found.set_attr("error", f"not handed to {target.label}: {exc.message}")
        queueing.remove(settings, target, registry, sweep=spec.sweep)  # its first trial, queued but not started
        raise
    finally:
        client.transport.close()
    return done.get("pid")


def fetch(settings, target, sweep: str, registry) -> dict:
    """The target's study copied over the controller's, each trial it queued recorded as an experiment of the sweep,
    and every row brought up to date; what the target says of its conductor."""
    from ..errors import NotFoundError
    from ..records.reconcile import client_for, reconcile
    from . import conductor, study as studies

    where = conductor.paths(settings.state_dir, sweep)
    client = client_for(settings, target)
    try:
        read = client.call([Op("sweep_read", {"project": settings.project.name, "sweep": sweep})],
                           what="read the sweep's study")[0]
        # a sweep stopped from here keeps its own copy: the trials the stop ended are told there, not on the target
        here = studies.Study.read(where["db"], sweep).attrs
        if not (read.get("ended") == "stopped" and here.get("stopped")):
            tmp = where["db"].with_name(where["db"].name + ".fetched")
            tmp.write_bytes(base64.b64decode(read["study"]))
            tmp.replace(where["db"])
        found = studies.Study.read(where["db"], sweep)
        if here.get("resumed") and found.attrs.get("resumed") != here["resumed"]:
            found.set_attr("resumed", here["resumed"])  # pruned trials run on from here (sweep resume --trial)
        trials = found.trials()
        first = next((t for t in trials if t["number"] == 0), None)
        template = registry.get(int(first["attrs"]["experiment"])) if first and first["attrs"].get("experiment") \
            else None
        for t in trials:
            attrs = t["attrs"]
            if template is None or not attrs.get("queued") or attrs.get("experiment") is None:
                continue
            try:
                registry.get(int(attrs["experiment"]))
                continue
            except NotFoundError:
                pass
            fields = {k: getattr(template, k) for k in COPIED}
            registry.insert_reserved(int(attrs["experiment"]), **fields, status="queued", sweep=sweep,
                                     message=attrs.get("message"), checkpoints=attrs.get("checkpoints"),
                                     created=float(attrs["queued"]))
        reconcile(settings, target, registry, client)
        for t in trials:  # told while still queued: the conductor took it out of the queue (the sweep ended)
            exp_id = t["attrs"].get("experiment")
            if t["state"] in ("complete", "pruned", "failed") and exp_id is not None:
                try:
                    exp = registry.get(int(exp_id))
                except NotFoundError:
                    continue
                if exp.status == "queued":
                    registry.update(exp.id, status="stopped", ended=time.time(),
                                    end_reason="removed from the queue before it started: "
                                               + (found.attrs.get("error") or "the sweep ended"))
    finally:
        client.transport.close()
    return {"conductor": read.get("conductor"), "ended": read.get("ended")}


def mark(db, names: list) -> None:
    """A marker beside a search's study while it goes on on its target (``<sweep>.target``: its --target, --ct)."""
    import json

    db.with_suffix(".target").write_text(json.dumps(names))


def marked(state_dir) -> list:
    """Each marker of a search going on on its target, with the target's (--target, --ct)."""
    import json

    folder = state_dir / "sweeps"
    try:  # (read on every status: a listing, where a glob would compile its pattern each time)
        names = sorted(n for n in os.listdir(folder) if n.endswith(".target"))
    except OSError:
        return []
    out = []
    for path in (folder / n for n in names):
        try:
            out.append((path, tuple(json.loads(path.read_text()))))
        except (OSError, ValueError):
            continue
    return out


def resume(settings, target, sweep: str) -> int | None:
    """The target's conductor started again (none runs); its pid."""
    return _one(settings, target, "sweep_start", sweep, "start the sweep's conductor again").get("pid")


def stop(settings, target, sweep: str) -> int | None:
    """The target's conductor ended, and kept from starting again; its pid, if one ran."""
    return _one(settings, target, "sweep_stop", sweep, "stop the sweep's conductor").get("stopped")


def _one(settings, target, op: str, sweep: str, what: str) -> dict:
    from ..records.reconcile import client_for

    client = client_for(settings, target)
    try:
        return client.call([Op(op, {"project": settings.project.name, "sweep": sweep})], what=what)[0]
    finally:
        client.transport.close()


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
