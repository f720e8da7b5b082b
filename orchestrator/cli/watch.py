"""status and logs: what a run is doing, read from the target."""

from __future__ import annotations

import sys
import time
from typing import Annotated, Optional

import typer

from . import common, render
from .common import CtOpt, CtsOpt, JsonOpt, TargetOpt, TargetsOpt, TrustOpt


def _status_dict(st: dict) -> dict:
    exp, run = st["experiment"], st["run"] or {}
    age = (st["now"] - run["log_mtime"]) if run.get("log_mtime") else None
    return {"target": st["target"], "target_label": st["label"], "target_info": st["info"],
            "experiment": exp.id if exp else None,
            "state": (exp.status if exp else None), "exit_code": exp.exit_code if exp else None,
            "end_reason": exp.end_reason if exp else None, "ended": exp.ended if exp else None,
            "revision": exp.revision if exp else None, "message": exp.message if exp else None,
            "started": exp.started if exp else None, "last_line": run.get("last_line"),
            "log_age_s": age, "log_bytes": run.get("log_size"), "summary": st.get("summary") or {},
            "gpus": st.get("gpus", []), "phase": run.get("phase"), "attempt": run.get("attempt"),
            "max_attempts": run.get("max_attempts"), "last_reason": run.get("last_reason"),
            "resumed_from": run.get("resumed_from")}


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


def register(app: typer.Typer) -> None:
    @app.command()
    def status(ctx: typer.Context, target: TargetsOpt = None, ct: CtsOpt = None, as_json: JsonOpt = False,
               watch: Annotated[bool, typer.Option("--watch", "-w", help="Refresh every 2 s")] = False,
               metrics: Annotated[bool, typer.Option("--metrics/--no-metrics", help="Read what is new in the "
                                                     "log for step, loss, throughput, ETA")] = True,
               all_: Annotated[bool, typer.Option("--all", "-a", help="Every target this project has run on")]
               = False,
               trust_new_host: TrustOpt = False) -> None:
        """The target's latest experiment: state, exit code, progress and the last log line."""
        from ..watch import metrics_view
        from ..errors import TransportError
        from ..records.reconcile import client_for, target_status

        settings = common.settings(ctx)
        if all_:
            return _status_all(settings, metrics, as_json, trust_new_host)
        grp = common.group(settings, target, ct, trust=trust_new_host)
        if grp is not None:
            from . import job

            return job.status(settings, grp, as_json)
        tgt = common.target(settings, *common.single(target, ct), trust=trust_new_host)
        client = None
        try:
            while True:
                try:
                    client = client or client_for(settings, tgt, read_only=True)
                    with common.registry(settings) as reg:
                        st = target_status(settings, tgt, reg, client)
                        if metrics:
                            st["summary"] = metrics_view.refresh(settings, tgt, reg, client, st["experiment"],
                                                                 now=st["now"])
                except TransportError as exc:
                    if not watch:
                        raise
                    render.say(f"orch: connection lost ({exc.message}); retrying in 2 s")
                    if client is not None:
                        client.transport.close()
                    client = None
                    time.sleep(2.0)
                    continue
                data = _status_dict(st)
                if as_json:
                    render.print_json(data)
                else:
                    if watch:
                        sys.stdout.write("\x1b[2J\x1b[H")
                    _print_status(data)
                if not watch:
                    break
                time.sleep(2.0)
        finally:
            if client is not None:
                client.transport.close()

    @app.command()
    def logs(ctx: typer.Context, target: TargetsOpt = None, ct: CtsOpt = None,
             experiment: Annotated[Optional[int], typer.Option("--experiment", "-e", min=1, max=common.ID_MAX,
                                                               help="Experiment id "
                                                               "(default: the target's latest)")] = None,
             lines: Annotated[int, typer.Option("-n", "--lines", min=0, max=common.ID_MAX,
                                                help="Start with the last N lines")] = 20,
             follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep following until the run ends, "
                                                  "across dropped connections")] = False,
             metrics: Annotated[bool, typer.Option("--metrics", help="Print parsed metrics instead of raw lines")]
             = False,
             node: Annotated[Optional[int], typer.Option("--node", min=0, max=common.ID_MAX,
                                                         help="A job's node: only its log (rank)")]
             = None,
             trust_new_host: TrustOpt = False) -> None:
        """Print a run's log; --follow keeps going until it ends (Ctrl-C stops following, not the run). A job's
        nodes are merged, each line prefixed with its node's rank."""
        from ..errors import NotFoundError
        from ..watch.follow import follow as follow_log
        from ..watch.metrics_view import as_recorded, target_flags
        from ..records.reconcile import recover, sync

        settings = common.settings(ctx)
        settings = settings if follow else common.read_only(settings)  # a first read is bounded by read_timeout
        grp = _job_of(settings, target, ct, experiment, trust_new_host)
        if grp is not None:
            from . import job

            write = _metrics_writer(settings) if metrics else _raw_writer()
            job.logs(settings, grp, experiment, write=write, lines=lines, follow=follow,
                     node=0 if metrics and node is None else node)
            if isinstance(write, _MetricsWriter):
                write.finish()
            return None
        if node is not None:
            from ..errors import InputError

            raise InputError("--node names a node of a job over several nodes, and this is one target",
                             hint="drop --node (or name the job's nodes: orch logs --ct A --ct B --node 1)")
        target, ct = common.single(target, ct)
        with common.registry(settings) as reg:
            if experiment is not None and target is None and ct is None:  # where that experiment ran
                target, ct = target_flags(settings, reg.get(experiment))
            tgt = common.target(settings, target, ct, trust=trust_new_host)
            recover(settings, tgt, reg)
            exp = reg.get(experiment) if experiment is not None else reg.latest(tgt.machine, tgt.name)
            if exp is None:
                raise NotFoundError(f"no experiment on {tgt.label}",
                                    hint="orch deploy starts one (or orch use picks the target you deployed to)")
            experiment, run_registry = exp.id, reg.run_registry(exp.id)
        if follow:
            render.say(f"orch: following experiment {experiment} on {tgt.label} (Ctrl-C stops following, "
                       "not the run)")
        write = _metrics_writer(as_recorded(settings, exp)) if metrics else _raw_writer()
        try:
            result = follow_log(settings, tgt, experiment, write=write, notice=lambda m: render.say(f"orch: {m}"),
                                follow=follow, tail_lines=lines, registry=run_registry)
        except KeyboardInterrupt:
            render.say("orch: stopped following (the run goes on)")
            raise typer.Exit(0) from None
        if isinstance(write, _MetricsWriter):
            write.finish()
        if follow:
            st = result.state
            if st.get("id") == experiment:
                with common.registry(settings) as reg:
                    sync(reg, [st], tgt, settings.project.name)
            render.say(f"orch: experiment {experiment} {st.get('state')} (exit code {st.get('exit_code')})")


def _job_of(settings, target, ct, experiment, trust: bool):
    """The job's nodes when the flags, the current target or ``-e N`` name a job over several nodes."""
    if experiment is not None and not target and not ct:
        with common.registry(settings) as reg:
            exp = reg.get(experiment)
        return common.job_group(settings, exp, trust=trust) if exp.nodes else None
    return common.group(settings, target, ct, trust=trust)


def _status_all(settings, metrics: bool, as_json: bool, trust: bool) -> None:
    """One status per target with experiments, all reached at once: an unreachable one costs its own timeout
    and says why, and the rest go on."""
    from concurrent.futures import ThreadPoolExecutor

    with common.registry(settings) as reg:
        latest: dict = {}
        for exp in reg.list(limit=500):
            latest.setdefault(exp.machine or exp.target, exp)
    exps = [exp for _, exp in sorted(latest.items())]
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(exps)))) as pool:
        results = list(pool.map(lambda exp: _status_one(settings, exp, metrics, trust), exps))
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


def _status_one(settings, exp, metrics: bool, trust: bool) -> dict:
    """``_status_dict`` of the target ``exp`` ran on (a job: its nodes), or what is recorded and why not."""
    from ..watch import metrics_view
    from ..errors import OrchError
    from ..records.reconcile import client_for, target_status

    client = None
    try:
        if exp.nodes:
            from ..launch import multinode

            grp = common.job_group(settings, exp, trust=trust)
            with common.registry(settings) as reg:
                job_exp, _ = multinode.status(settings, grp, reg)
            return {"target": grp.name, "target_label": grp.label, "experiment": job_exp.id,
                    "state": job_exp.status, "exit_code": job_exp.exit_code, "nodes": job_exp.nodes, "job": job_exp}
        target, ct = metrics_view.target_flags(settings, exp)
        tgt = common.target(settings, target, ct, trust=trust)
        client = client_for(settings, tgt, read_only=True)
        with common.registry(settings) as reg:
            st = target_status(settings, tgt, reg, client)
            if metrics:
                st["summary"] = metrics_view.refresh(settings, tgt, reg, client, st["experiment"], now=st["now"])
        return _status_dict(st)
    except OrchError as exc:
        return {"target": exp.target, "target_label": exp.target, "experiment": exp.id,
                "state": exp.status, "exit_code": exp.exit_code, "error": exc.message}
    finally:
        if client is not None:
            client.transport.close()


def _raw_writer():
    out = sys.stdout.buffer

    def write(data: bytes) -> None:
        out.write(data)
        out.flush()
    return write


class _MetricsWriter:
    """Prints each metric event of the log bytes it is given (a progress bar's ``\r`` updates each count),
    and counts the lines, to say when none of them held a metric."""

    def __init__(self, settings) -> None:
        from ..watch.logparse import Parser

        self.parser = Parser(settings.metrics.patterns or None)
        self.buf = bytearray()
        self.lines = self.events = 0

    def __call__(self, data: bytes) -> None:
        self.buf.extend(data)
        cut = max(self.buf.rfind(b"\n"), self.buf.rfind(b"\r")) + 1
        if cut:
            self._lines(bytes(self.buf[:cut]))
            del self.buf[:cut]

    def _lines(self, data: bytes) -> None:
        for line in data.decode("utf-8", "replace").replace("\r\n", "\n").split("\n"):
            if not line.strip():
                continue
            self.lines += 1
            for ev in self.parser.events(line):
                self.events += 1
                render.out("  ".join(f"{k}={v:g}" for k, v in ev.items()))

    def finish(self) -> None:
        """The rest of the log (its unterminated last line), then the notice when no line held a metric: on
        stderr, with exit code 0 (the log was read; it just holds no metric orch knows)."""
        if self.buf:
            self._lines(bytes(self.buf))
            self.buf.clear()
        if self.lines and not self.events:
            from ..watch.metrics_view import no_metrics_note

            render.say(f"orch: {no_metrics_note(self.lines)}")


def _metrics_writer(settings) -> _MetricsWriter:
    return _MetricsWriter(settings)


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
    for g in d.get("gpus") or []:
        render.out(f"  gpu {g['index']} {g['name']}: {g['util']}% busy, {g['mem_used_mib']}/{g['mem_total_mib']} MiB")
    render.out(f"  last log line ({render.ago(d['log_age_s'])}): {d['last_line'] or '-'}")
