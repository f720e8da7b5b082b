"""orch status: the latest experiment of a target (or of every target, or of a job's nodes), read and drawn."""

from __future__ import annotations

import functools
import sys
from typing import Annotated

import typer

from . import common, render
from .common import CtsOpt, JsonOpt, TargetsOpt, TrustOpt

WatchOpt = Annotated[bool, typer.Option("--watch", "-w", help="Refresh every 2 s")]
MetricsOpt = Annotated[bool, typer.Option("--metrics/--no-metrics", help="Read what is new in the log for step, "
                                          "loss, throughput, ETA")]
AllOpt = Annotated[bool, typer.Option("--all", "-a", help="Every target this project has run on")]


def status(ctx: typer.Context, target: TargetsOpt = None, ct: CtsOpt = None, as_json: JsonOpt = False,
           watch: WatchOpt = False, metrics: MetricsOpt = True, all_: AllOpt = False,
           trust_new_host: TrustOpt = False) -> None:
    """The target's latest experiment: state, exit code, progress and the last log line."""
    from ..watch import status as reading

    settings = common.settings(ctx)
    open_registry = functools.partial(common.registry, settings)
    if all_:
        results = reading.read_all(settings, open_registry,
                                   lambda name, ct_: common.target(settings, name, ct_, trust=trust_new_host),
                                   functools.partial(_read_job, settings, trust=trust_new_host),
                                   metrics=metrics)
        return _show_all(settings, results, as_json)
    grp = common.group(settings, target, ct, trust=trust_new_host)
    if grp is not None:
        from . import job

        return job.status(settings, grp, as_json)
    tgt = common.target(settings, *common.single(target, ct), trust=trust_new_host)
    reading.watch(settings, tgt, open_registry, metrics=metrics, repeat=watch, notice=render.say,
                  show=functools.partial(_show, as_json=as_json, clear=watch))


def _read_job(settings, exp, registry, *, trust: bool) -> tuple:
    """(the job's group, its row settled from every node's answer) for ``status --all``."""
    from ..launch import multinode

    grp = common.job_group(settings, exp, trust=trust)
    return grp, multinode.status(settings, grp, registry)[0]


def _show(data: dict, *, as_json: bool, clear: bool) -> None:
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


def _how_it_ended(d: dict) -> str:
    """`` (exit code 0)``, `` (SIGHUP: the tmux server went away)``, `` (exit code 130; stopped by experiment 7)``."""
    if d["state"] not in ("crashed", "finished", "stopped", "failed", "lost"):
        return ""
    reason = d.get("end_reason")
    if not reason or reason == f"exit code {d['exit_code']}":
        return f" (exit code {d['exit_code']})"
    if d["state"] == "stopped":
        return f" (exit code {d['exit_code']}; {reason})"
    return f" ({reason})"


def _print_status(d: dict) -> None:
    if d["experiment"] is None:
        render.out(f"{d['target_label']}: no experiment yet (orch deploy starts one)")
        return
    code = _how_it_ended(d)
    state = "restarting" if d["state"] == "running" and d.get("phase") == "restarting" else d["state"]
    render.out(f"{d['target_label']}: experiment {d['experiment']} {state}{code}, revision {d['revision']}")
    if (tried := _attempt_line(d)) is not None:
        render.out(f"  {tried}")
    if d.get("message"):
        render.out(f"  message: {d['message']}")
    s = d.get("summary") or {}
    parts = []
    if s.get("step") is not None:
        parts.append(f"step={s['step']}" + (f"/{s['total_steps']}" if s.get("total_steps") else ""))
    if s.get("loss") is not None:
        parts.append(f"loss={s['loss']:.4g}")
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


def register(app: typer.Typer) -> None:
    app.command()(status)
