"""orch sweep --trials N (a search): checked, its study created, its conductor started; and the search's views.

The conductor (``launch/conductor.py``) runs as a detached ``orch sweep conduct S`` beside the project, as the
connection keeper does: the command returns at once and the search goes on with the terminal closed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import typer

from . import common, render
from ..errors import InputError, OrchError


def _check(choice: str | None, allowed: tuple[str, ...], flag: str, default: str) -> str:
    if choice is None:
        return default
    if choice not in allowed:
        raise InputError(f"{flag} {choice!r} is not one of {', '.join(allowed)}", hint=f"e.g. {flag} {default}")
    return choice


def start(ctx: typer.Context, chosen, sets: list[str], *, steps, minutes, target, ct, message, trust, as_json, gpus,
          beside, prune, metric, mode, rung_by, min_steps, parallel, seed, foreground, on_target=False) -> None:
    from ..launch import conductor, space, study
    from ..launch import sweep as sweeping

    prune = _check(prune, space.PRUNERS, "--prune", "median")
    mode = _check(mode, ("min", "max"), "--mode", "min")
    rung_by = _check(rung_by, ("steps", "tokens"), "--rung-by", "steps")
    if minutes is not None:
        raise InputError("a search measures its trials in steps: give --steps N, not --minutes",
                         hint="e.g. orch sweep --set run.lr=loguniform(1e-5,1e-2) --trials 12 --steps 200")
    if steps is None:
        raise InputError("a search needs each trial's budget: --steps N",
                         hint="e.g. orch sweep --set run.lr=loguniform(1e-5,1e-2) --trials 12 --steps 200")
    grace = min_steps if min_steps is not None else space.default_min_steps(steps)
    if grace >= steps:
        raise InputError(f"--min-steps {grace} leaves no step to prune at: it must be below --steps {steps}",
                         hint=f"e.g. --min-steps {space.default_min_steps(steps)}")
    if metric is not None and not metric.strip():
        raise InputError("--metric is empty", hint="name a metric the log prints, e.g. --metric val_loss")
    per_trial = sweeping.check_beside(gpus, beside)
    settings = common.settings(ctx)
    # every bound and choice loaded once, so a value the settings refuse stops the sweep before any trial
    for key, dist in chosen.space.items():
        values = dist.values if isinstance(dist, space.Choice) else \
            [int(dist.low), int(dist.high)] if dist.integer else [dist.low, dist.high]
        for value in values:
            common.settings(ctx, [space.as_set(key, value)])
    names = [[n, None] for n in target or []] + [[None, c] for c in ct or []] or [[None, None]]
    targets = [common.target(settings, n, c, trust=trust) for n, c in names]
    study._optuna()  # the extra is there before anything is written
    spec = conductor.Spec(sweep=sweeping.new_id(), sets=list(sets), trials=chosen.trials, sampler=chosen.sampler,
                          prune=prune, metric=metric or conductor.AUTO, mode=mode, rung_by=rung_by, steps=steps,
                          min_steps=grace, parallel=parallel or 1, gpus=per_trial, targets=names, message=message,
                          seed=seed, base_tokens=settings.batching.token_budget if rung_by == "tokens" else None,
                          on_target=on_target)
    where = conductor.paths(settings.state_dir, spec.sweep)
    if on_target:
        from ..launch import sweep_target

        if foreground:
            raise InputError("--foreground conducts the sweep here, and --on-target on its target",
                             hint="give one of them")
        sweep_target.check(chosen.space, spec, targets)
        with common.registry(settings) as reg:
            pid = sweep_target.start(settings, targets[0], spec, chosen.space, reg, lambda o: common.settings(ctx, o),
                                     study.Study.open)
        sweep_target.mark(where["db"], names[0])  # orch status records its trials until it has ended
    else:
        conductor.start(settings.state_dir, spec, chosen.space, study.Study.open)
        pid = None if foreground else _detach(settings, spec.sweep, where["log"])[0]
    if as_json:
        render.print_json({"sweep": spec.sweep, "trials": spec.trials, "sampler": spec.sampler, "prune": prune,
                           "conductor": pid, "on_target": targets[0].label if on_target else None, "log": str(where["log"]), "targets": [t.label for t in targets]})
    else:
        render.out(f"sweep {spec.sweep}: {spec.trials} trial(s), {spec.sampler} sampler, pruning {prune}, "
                   f"{spec.parallel} at a time on {', '.join(t.label for t in targets)}")
        if pid and on_target:
            render.out(f"  conducted on {targets[0].label} by process {pid}, kept alive there as its queue is: it "
                       "goes on with this controller gone")
        elif pid:
            render.out(f"  conducted by process {pid} (its log: {where['log']}); it goes on with this terminal closed")
            if all(t.spec.kind != "local" for t in targets):
                render.out("  with this machine off, the trials handed out finish and no new one starts (orch sweep "
                           f"resume {spec.sweep} goes on); --on-target conducts a search on its target instead")
        render.out(f"orch sweep show {spec.sweep} ranks the trials; orch sweep stop {spec.sweep} stops it")
    if foreground:
        conduct(ctx, spec.sweep)


def _detach(settings, sweep: str, log: Path) -> tuple[int, bool]:
    """``orch sweep conduct S`` in a session of its own, writing to its log: a closed terminal does not end it.
    Returns once a conductor holds the sweep's lock: the pid of the one that does, and whether it is the one
    started here (another, started at the same moment, may have won it; this one then ends)."""
    import time

    from ..launch import conductor

    argv = [sys.executable, "-m", "orchestrator"]
    if settings.config_path is not None:
        argv += ["--config", str(settings.config_path)]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        child = subprocess.Popen([*argv, "sweep", "conduct", sweep], cwd=settings.project_dir,
                                 stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    lock = conductor.paths(settings.state_dir, sweep)["lock"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pid = conductor.holder(lock)
        if pid is not None and (pid == child.pid or child.poll() is not None):
            return pid, pid == child.pid
        if child.poll() is not None:
            raise OrchError(f"the conductor of sweep {sweep} ended at once (exit {child.returncode})",
                            hint=f"its log says why: {log}")
        time.sleep(0.05)
    return child.pid, True


def conduct(ctx: typer.Context, sweep: str) -> None:
    from ..launch import conductor, study

    settings = common.settings(ctx)
    where = conductor.paths(settings.state_dir, sweep)
    if not where["db"].exists():
        raise InputError(f"no search {sweep!r} in this project", hint="orch experiments list shows each sweep")
    if _on_target(settings, sweep):
        raise InputError(f"sweep {sweep} is conducted on its target", hint=f"orch sweep resume {sweep} starts it there")
    lock = conductor.locked(where["lock"])
    if lock is None:
        render.out(f"sweep {sweep}: already conducted by process {conductor.holder(where['lock'])}")
        return
    hooks = conductor.Hooks(settings_for=lambda o: common.settings(ctx, o),
                            target_for=lambda s, n, c: common.target(s, n, c),
                            registry=common.registry, echo=lambda line: print(line, flush=True))
    try:
        conductor.Conductor(settings.state_dir, sweep, study.Study.open, hooks).run()
    finally:
        os.close(lock)


def resume(ctx: typer.Context, sweep: str, as_json: bool) -> None:
    from ..launch import conductor

    settings = common.settings(ctx)
    where = conductor.paths(settings.state_dir, sweep)
    if not where["db"].exists():
        raise InputError(f"no search {sweep!r} in this project",
                         hint="only a searching sweep has a conductor to resume (orch sweep --set K=RANGE --trials N)")
    target = _on_target(settings, sweep)
    if target is not None:
        from ..launch import sweep_target

        with common.registry(settings) as reg:
            had = sweep_target.fetch(settings, target, sweep, reg)["conductor"]
        pid = had or sweep_target.resume(settings, target, sweep)
        started = had is None and pid is not None
    else:
        pid = conductor.holder(where["lock"])
        started = False
        if pid is None:
            pid, started = _detach(settings, sweep, where["log"])
    if as_json:
        render.print_json({"sweep": sweep, "conductor": pid, "started": started})
    elif target is not None and pid is None:
        render.out(f"sweep {sweep}: its conductor on {target.label} has nothing left to do")
    elif target is not None:
        render.out(f"sweep {sweep}: conducted on {target.label} by process {pid}"
                   + (" (started again)" if started else ""))
    elif started:
        render.out(f"sweep {sweep}: conducted again by process {pid} (its log: {where['log']})")
    else:
        render.out(f"sweep {sweep}: already conducted by process {pid}")


RESUMABLE = ("pruned",)


def resume_trial(ctx: typer.Context, sweep: str, number: int, as_json: bool) -> None:
    """A pruned (or stopped) trial run again to its full budget from its checkpoint: ``orch restart -e`` of its
    experiment, queued on its target behind the sweep's other trials, with the trial's budget; the study keeps
    which experiment resumed it (the conductor never follows it: its message names a resumed trial)."""
    import dataclasses

    from .. import checkpoints
    from ..launch import conductor, prepare, queueing, study
    from ..launch.operations import execute
    from ..records.reconcile import recover
    from ..watch.metrics_view import target_flags

    settings = common.settings(ctx)
    where = conductor.paths(settings.state_dir, sweep)
    if not where["db"].exists():
        raise InputError(f"no search {sweep!r} in this project",
                         hint="orch experiments list shows each sweep; only a search's trials can be resumed")
    target = _on_target(settings, sweep)
    if target is not None:  # the trial as the target's study has it, its experiment recorded here
        from ..launch import sweep_target

        with common.registry(settings) as reg:
            sweep_target.fetch(settings, target, sweep, reg)
    found = study.Study.read(where["db"], sweep)
    trials = {t["number"]: t for t in found.trials()}
    if number not in trials:
        raise InputError(f"sweep {sweep} has no trial {number}",
                         hint=f"its trials are {', '.join(map(str, sorted(trials))) or 'none yet'} "
                              f"(orch sweep show {sweep})")
    trial, attrs = trials[number], trials[number]["attrs"]
    with common.registry(settings) as reg:
        exp = reg.get(attrs["experiment"]) if attrs.get("experiment") else None
        stopped = exp is not None and exp.status == "stopped"
        if trial["state"] not in RESUMABLE and not stopped:
            raise InputError(f"trial {number} of sweep {sweep} is {trial['state']}, not pruned or stopped: "
                             "there is nothing to resume", hint=f"orch sweep show {sweep} marks the pruned trials")
        # kept with the study, not the trial: Optuna keeps an ended trial as it ended
        resumed = dict(found.attrs.get("resumed") or {})
        if str(number) in resumed:
            again = resumed[str(number)]["experiment"]
            raise InputError(f"trial {number} of sweep {sweep} was resumed already, as experiment {again}",
                             hint=f"orch status -e {again} says where it is")
        if exp is None:
            raise InputError(f"trial {number} of sweep {sweep} never started: it has no checkpoint to resume",
                             hint=f"orch sweep show {sweep}")
        name, ct = target_flags(settings, exp)
        tgt = common.target(settings, name, ct)
        if tgt.connect is not None:
            recover(settings, tgt, reg)
        # in the pruned run's own folder (a trial's is a variant's, beside its lineage): its checkpoint is the
        # newest there, so the agent hands it to the first attempt as ORCH_RESUME_FROM
        tgt = dataclasses.replace(checkpoints.ran_with(tgt, exp), checkpoints=exp.checkpoints or tgt.checkpoints)
        spec = found.attrs["spec"]
        budget = int(attrs.get("budget_steps") or spec["steps"])
        said = ", ".join(f"{k}={_short(v)}" for k, v in trial["params"].items())
        plan = prepare.restart(settings, tgt, reg, message=f"sweep {sweep}: resumed trial {number}: {said}",
                               clean=False, purge=False, yes=True, confirm=None, echo=lambda _m: None,
                               parent=exp, job=True)  # job: the target is given as it ran, folder included
        plan.env = {**plan.env, "ORCH_MAX_STEPS": str(budget), "ORCH_SWEEP_TRIAL": str(number)}
        plan.sweep, plan.in_folder = sweep, True
        plan = queueing.queued(plan)  # behind the sweep's trials in flight there, never stopping one
        if spec.get("gpus") is not None:
            plan.beside = {"gpus": spec["gpus"], "total": tgt.spec.gpus}
        done = execute(plan, reg)
        new = done.experiment
        assert new is not None
        resumed[str(number)] = {"experiment": new.id, "from": exp.id, "budget_steps": budget}
        found.set_attr("resumed", resumed)
        position = (done.queue or {}).get("position")
    if as_json:
        render.print_json({"sweep": sweep, "trial": number, "experiment": new.id, "from": exp.id,
                           "status": new.status, "position": position, "budget_steps": budget})
        return
    where_now = "started" if new.status == "running" else f"queued at position {position}"
    render.out(f"sweep {sweep}: trial {number} resumed to its {budget} steps from experiment {exp.id}'s checkpoint: "
               f"experiment {new.id} {where_now} on {tgt.label}")


def halt(settings, sweep: str) -> int | None:
    """Ends the sweep's conductor (before its trials are stopped, so it asks no new one); its pid, if one ran."""
    import signal
    import time

    from ..launch import conductor

    target = _on_target(settings, sweep)
    if target is not None:
        from ..launch import sweep_target

        pid = sweep_target.stop(settings, target, sweep)
        with common.registry(settings) as reg:  # the trials it queued, recorded here to be dequeued and stopped
            sweep_target.fetch(settings, target, sweep, reg)
        return pid
    where = conductor.paths(settings.state_dir, sweep)
    pid = conductor.holder(where["lock"])
    if pid is None:
        return None
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return None
    deadline = time.monotonic() + 30
    while conductor.holder(where["lock"]) == pid and time.monotonic() < deadline:
        time.sleep(0.1)
    return pid


def stopped(settings, sweep: str) -> None:
    """A stopped search's trials still in flight are told they failed, so its study shows none running."""
    from ..launch import conductor, study

    found = study.Study.read(conductor.paths(settings.state_dir, sweep)["db"], sweep)
    for t in found.trials():
        if t["state"] in ("running", "waiting"):
            found.trial_attr(t["number"], "error", "stopped by orch sweep stop")
            found.tell(t["number"], state="failed")
    found.set_attr("stopped", True)


def learn(settings, notice) -> None:
    """``orch status``: the trials each search conducted on a target has started since the last look, recorded as
    experiments of their sweep (only while such a search goes on: a marker beside its study says so)."""
    from ..launch import sweep_target

    for marker, (name, ct) in sweep_target.marked(settings.state_dir):
        sweep = marker.name.split(".")[0]
        try:
            target = common.target(settings, name, ct)
            with common.registry(settings) as reg:
                read = sweep_target.fetch(settings, target, sweep, reg)
        except OrchError as exc:
            notice(f"orch: sweep {sweep} not read on its target: {exc.message}")
            continue
        if read.get("ended"):
            marker.unlink(missing_ok=True)


def _on_target(settings, sweep: str):
    """The target a sweep is conducted on (``--on-target``), or None: the controller conducts it."""
    from ..launch import conductor, study

    where = conductor.paths(settings.state_dir, sweep)
    if not where["db"].exists():
        return None
    spec = study.Study.read(where["db"], sweep).attrs.get("spec") or {}
    if not spec.get("on_target"):
        return None
    name, ct = spec["targets"][0]
    return common.target(settings, name, ct)


def is_search(settings, sweep: str) -> bool:
    from ..launch import conductor

    return conductor.paths(settings.state_dir, sweep)["db"].exists()


def show(settings, sweep: str, as_json: bool) -> None:
    """The search's trials ranked from its study (what the conductor last read: no target is asked)."""
    from ..launch import conductor, search_view, study

    where = conductor.paths(settings.state_dir, sweep)
    target = _on_target(settings, sweep)
    there = None
    if target is not None:  # the target's study, and the trials it started recorded here
        from ..launch import sweep_target

        with common.registry(settings) as reg:
            there = sweep_target.fetch(settings, target, sweep, reg)["conductor"]
    found = study.Study.read(where["db"], sweep)
    attrs = found.attrs
    table = search_view.table(attrs["spec"], found.trials(), attrs.get("metric"), attrs.get("error"),
                              attrs.get("resumed"))
    table["conductor"] = there if target is not None else conductor.holder(where["lock"])
    table["on_target"] = target.label if target is not None else None
    if as_json:
        from ..launch import space

        # what orch ui draws (parallel coordinates, a scatter a parameter) and sweep plot draws as an image
        table["coordinates"] = search_view.coordinates(table, space.axes(attrs["spec"]["sets"]))
        render.print_json(table)
        return
    rows = table["rows"]
    render.table(f"sweep {sweep}: {table['trials_asked']}/{table['trials']} trial(s), {table['sampler']}, "
                 f"pruning {table['prune']}, objective {table['metric']} ({table['mode']})",
                 ["", "trial", "exp", "state", *table["keys"], table["metric"], "rung", "threshold", "steps",
                  "tokens"],
                 [["best" if r["best"] else "", r["trial"], r["experiment"],
                   r["state"] + (f" (resumed: exp {r['resumed']})" if r.get("resumed") else ""),
                   *(_short(r["params"].get(k)) for k in table["keys"]),
                   _short(r["objective"]), r["rung"], _short(r["threshold"]), _short(r["steps"]),
                   _short(r["tokens"])] for r in rows])
    if table["saved"] is not None and not any(r["state"] == "pruned" for r in rows):
        render.out(f"no trial was pruned: steps run {table['steps_run']:g} of {table['steps_budget']:g} budgeted "
                   "(a graceful stop runs a step or two past its budget)")
    elif table["saved"] is not None:
        render.out(f"steps run: {table['steps_run']:g} of {table['steps_budget']:g} had every ended trial run its "
                   f"budget: pruning saved {table['saved']:.0%}")
    if table["error"]:
        render.out(f"the sweep ended: {table['error']}")
    elif table["conductor"] is None and any(r["state"] in ("running", "waiting") for r in rows) or \
            (table["conductor"] is None and table["trials_asked"] < table["trials"] and not table["error"]):
        render.out(f"no conductor is running: orch sweep resume {sweep} goes on with it")


def _short(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def plot(settings, sweep: str, out: Path) -> Path:
    """Parallel coordinates and a scatter a parameter, as a PNG (``orch sweep plot``, ``orch experiments plot
    --sweep`` of a search)."""
    from ..launch import conductor, search_view, space, study
    from ..records.plots import draw_search

    where = conductor.paths(settings.state_dir, sweep)
    if not where["db"].exists():
        raise InputError(f"no search {sweep!r} in this project",
                         hint="orch experiments plot --sweep S draws any sweep's curves; a parallel-coordinates "
                              "plot is of a search (orch sweep --set K=RANGE --trials N)")
    found = study.Study.read(where["db"], sweep)
    attrs = found.attrs
    table = search_view.table(attrs["spec"], found.trials(), attrs.get("metric"), attrs.get("error"),
                              attrs.get("resumed"))
    coords = search_view.coordinates(table, space.axes(attrs["spec"]["sets"]))
    if not coords["lines"]:
        raise InputError(f"sweep {sweep} has no ended trial to draw yet", hint=f"orch sweep show {sweep} says where it is")
    return draw_search(coords, out)
