"""orch status: the latest experiment of a target (or of every target, or of a job's nodes), read and drawn."""

from __future__ import annotations

import functools
import sys
from typing import Annotated

import typer

from . import common, render
from .common import CtsOpt, JsonOpt, TargetsOpt, TrustOpt
from .logs import ExperimentOpt

WatchOpt = Annotated[bool, typer.Option("--watch", "-w", help="Refresh every 2 s")]
MetricsOpt = Annotated[bool, typer.Option("--metrics/--no-metrics", help="Read what is new in the log for step, "
                                          "loss, throughput, ETA")]
AllOpt = Annotated[bool, typer.Option("--all", "-a", help="Every target this project has run on")]


def status(ctx: typer.Context, target: TargetsOpt = None, ct: CtsOpt = None, as_json: JsonOpt = False,
           watch: WatchOpt = False, metrics: MetricsOpt = True, all_: AllOpt = False,
           trust_new_host: TrustOpt = False, experiment: ExperimentOpt = None) -> None:
    """The target's latest experiment (or -e ID): state, exit code, progress and the last log line; every
    live run of the project there when several run side by side."""
    from ..watch import status as reading

    settings = common.settings(ctx, lenient=True)
    open_registry = functools.partial(common.registry, settings)
    if all_:
        results = reading.read_all(settings, open_registry,
                                   lambda name, ct_: common.target(settings, name, ct_, trust=trust_new_host),
                                   functools.partial(_read_job, settings, trust=trust_new_host),
                                   metrics=metrics)
        return _show_all(settings, results, as_json)
    from . import sweep_search

    sweep_search.learn(settings, render.say)  # the trials a search conducted on its target started meanwhile
    grp = common.group(settings, target, ct, trust=trust_new_host)
    if grp is not None:
        from . import job

        return job.status(settings, grp, as_json)
    flags = common.single(target, ct)
    if experiment is not None and flags == (None, None):  # where it ran
        from ..watch.metrics_view import target_flags

        with open_registry() as reg:
            flags = target_flags(settings, reg.get(experiment))
    tgt = common.target(settings, *flags, trust=trust_new_host)
    said: list = [] if experiment is None else [True]  # the run acted on is said once, not at each refresh
    reading.watch(settings, tgt, open_registry, metrics=metrics, repeat=watch, notice=render.say,
                  show=functools.partial(_show, as_json=as_json, clear=watch, said=said, project=settings.project.name),
                  experiment=experiment)


def _read_job(settings, exp, registry, *, trust: bool) -> tuple:
    """(the job's group, its row settled from every node's answer) for ``status --all``."""
    from ..launch import multinode

    grp = common.job_group(settings, exp, trust=trust)
    return grp, multinode.status(settings, grp, registry)[0]


def _show(data: dict, *, as_json: bool, clear: bool, said: list | None = None, project: str = "") -> None:
    from ..records.side_by_side import note

    told = note(project, [r["experiment"] for r in data.get("live") or []], data.get("experiment"))
    if told and said is not None and not said:
        render.say(f"orch: {told}")
        said.append(True)
    if as_json:
        render.print_json(data)
        return
    if clear:
        sys.stdout.write("\x1b[2J\x1b[H")
    _print_status(data)


def _show_all(settings, results: list[dict], as_json: bool) -> None:
    if as_json:
        render.print_json([{k: v for k, v in d.items() if k != "job"} for d in results])
        return
    if not results:
        render.out("no experiments yet (orch deploy starts one)")
    for data in results:
        if data.get("error"):
            render.out(f"{data['target_label']}: unreachable ({data['error']}); last recorded: experiment "
                       f"{data['experiment']} {data['state']}")
        elif data.get("nodes") is not None:
            from . import job

            render.out(f"{data['target_label']}: experiment {data['experiment']} {data['state']}"
                       + job.progress_note(data["job"], settings))
            job._node_lines(data["job"], settings)
        else:
            _print_status(data)


def _attempt_line(d: dict) -> str | None:
    """``attempt 2/4, resumed from /ckpt/ckpt-40.pt, last failure: exit code 1`` (runs with restarts only)."""
    if not d.get("max_attempts") or d["max_attempts"] < 2:
        return None
    parts = [f"attempt {d['attempt']}/{d['max_attempts']}"]
    if d.get("resumed_from") and (d.get("attempt") or 0) > 1:
        parts.append(f"resumed from {d['resumed_from']}")
    if d.get("last_reason"):
        parts.append(f"last failure: {d['last_reason']}")
    return ", ".join(parts)


def _notify_line(n: dict | None) -> str | None:
    """``notifications: 1 sent, 2 failed (last: crashed: HTTP 500 Internal Server Error)``."""
    if not n:
        return None
    line = f"notifications: {n.get('sent', 0)} sent, {n.get('failed', 0)} failed"
    last = n.get("last_failure")
    return line + (f" (last: {last.get('event')}: {last.get('error')})" if n.get("failed") and last else "")


def _guard_line(d: dict) -> str | None:
    """``guard: step 84/200, throughput 0.97× parent`` while it watches; ``guard: passed`` once it held."""
    g = d.get("guard")
    if not isinstance(g, dict):
        return None
    state = g.get("state")
    if state == "watching":
        ratio = f", throughput {g['ratio']:.2f}× parent" if g.get("ratio") is not None else ""
        return f"guard: step {g.get('step', 0)}/{g.get('of')}{ratio}"
    if state == "passed":
        ratio = f" (throughput {g['ratio']:.2f}× parent)" if g.get("ratio") is not None else ""
        return f"guard: passed{ratio}"
    if state == "failed":
        return f"guard: failed: {g.get('reason')}; " + ("rolling back" if g.get("on_fail") == "rollback" else "stopped")
    if state == "rolled back":
        return f"guard: failed: {g.get('reason')}; rolled back (experiment {g.get('restored')})"
    if state == "rollback failed":
        return f"guard: failed: {g.get('reason')}; the rollback failed: {g.get('error')} (orch checkpoints list " \
               "shows where the checkpoints are)"
    return f"guard: {state}" + (f": {g['reason']}" if g.get("reason") else "")


def _how_it_ended(d: dict) -> str:
    """`` (exit code 0)``, `` (SIGHUP: the tmux server went away)``, `` (exit code 130; stopped by experiment 7)``."""
    if d["state"] not in ("crashed", "finished", "stopped", "failed", "lost"):
        return ""
    reason, code = d.get("end_reason"), render.exit_code(d.get("exit_code"))
    if not reason or reason == code:
        return f" ({code})"
    if d["state"] == "stopped" and d.get("exit_code") is not None:
        return f" ({code}; {reason})"
    return f" ({reason})"


def _accounted(said: dict | None) -> str:
    """``; sacct: FAILED, exit code 3:0, ran 00:01:02``: how Slurm's accounting saw the job end (where it is on)."""
    if not isinstance(said, dict) or not said.get("state"):
        return ""
    ran = f", ran {said['elapsed']}" if said.get("elapsed") else ""
    return f"; sacct: {said['state']}, exit code {said.get('exit_code') or '?'}{ran}"


def _print_status(d: dict) -> None:
    if d["experiment"] is None:
        render.out(f"{d['target_label']}: no experiment yet (orch deploy starts one)")
        return
    code = _how_it_ended(d)
    state = "restarting" if d["state"] == "running" and d.get("phase") == "restarting" else d["state"]
    if d.get("slurm") and state in ("queued", "running"):  # a Slurm job: pending (its reason), its nodes
        from ..launch.slurm import state_words

        state = state_words(state, d["slurm"])
    render.out(f"{d['target_label']}: experiment {d['experiment']} {state}{code}, revision {d['revision']}")
    if (tried := _attempt_line(d)) is not None:
        render.out(f"  {tried}")
    if (watched := _guard_line(d)) is not None:
        render.out(f"  {watched}")
    if (job := d.get("slurm")):
        render.out(f"  Slurm job {job.get('job_id')}" + (f", partition {job['partition']}" if job.get("partition")
                                                          else "") + _accounted(job.get("sacct")))
    if d.get("message"):
        render.out(f"  message: {d['message']}")
    if (told := _notify_line(d.get("notify"))) is not None:
        render.out(f"  {told}")
    s = d.get("summary") or {}
    parts = []
    if s.get("step") is not None:
        parts.append(f"step={s['step']}" + (f"/{s['total_steps']}" if s.get("total_steps") else ""))
    if s.get("loss") is not None:
        parts.append(f"loss={s['loss']:.4g}")
    if s.get("eval_loss") is not None:
        parts.append(f"{s.get('eval_metric') or 'val_loss'}={s['eval_loss']:.4g}")
    for k in ("throughput", "eta", "spikes"):
        if s.get(k) is not None:
            parts.append(f"{k}={s[k]}")
    if parts:
        render.out("  " + "  ".join(parts))
    for note in s.get("notes", []):
        render.out(f"  ! {note}")
    mine = {g.get("uuid") for g in d.get("run_gpus") or []}
    for g in d.get("gpus") or []:
        if mine and g.get("uuid") not in mine:
            continue  # the run was given some of the GPUs (--gpus N): those are the ones to read
        given = " (the run's)" if mine else ""
        render.out(f"  gpu {g['index']} {g['name']}: {g['util']}% busy, {g['mem_used_mib']}/{g['mem_total_mib']} MiB"
                   + given)
    render.out(f"  last log line ({render.ago(d['log_age_s'])}): {d['last_line'] or '-'}")
    live = d.get("live") or []
    if len(live) > 1:
        render.out(f"  {len(live)} runs side by side here:")
        for r in live:
            gpus = f" on GPU {','.join(map(str, r['gpus']))}" if r.get("gpus") else ""
            render.out(f"    experiment {r['experiment']} {r['state']}{gpus}, revision {r['revision']}, checkpoints "
                       f"{r['checkpoints']}" + (f": {r['message']}" if r.get("message") else ""))
    for q in d.get("queue") or []:
        sweep = f" (sweep {q['sweep']})" if q.get("sweep") else ""
        waits = f", {q['waiting']}" if q.get("waiting") else ""
        render.out(f"  queued {q['position']}: experiment {q['id']}{sweep}{waits}")


def register(app: typer.Typer) -> None:
    app.command()(status)
