"""orch logs: a run's log (or a job's nodes' logs, merged), printed or followed to the run's end."""

from __future__ import annotations

import functools
import sys
from typing import Annotated, Optional

import typer

from .. import after_answer
from . import common, render
from .common import CtsOpt, TargetsOpt, TrustOpt

ExperimentOpt = Annotated[Optional[int], typer.Option("--experiment", "-e", min=1, max=common.ID_MAX,
                                                      help="Experiment id (default: the target's latest)")]
LinesOpt = Annotated[int, typer.Option("-n", "--lines", min=0, max=common.ID_MAX, help="Start with the last N lines")]
FollowOpt = Annotated[bool, typer.Option("--follow", "-f", help="Keep following until the run ends, across dropped "
                                         "connections")]
MetricsOpt = Annotated[bool, typer.Option("--metrics", help="Print parsed metrics instead of raw lines")]
NodeOpt = Annotated[Optional[int], typer.Option("--node", min=0, max=common.ID_MAX,
                                                help="A job's node: only its log (rank)")]


def logs(ctx: typer.Context, target: TargetsOpt = None, ct: CtsOpt = None, experiment: ExperimentOpt = None,
         lines: LinesOpt = 20, follow: FollowOpt = False, metrics: MetricsOpt = False, node: NodeOpt = None,
         trust_new_host: TrustOpt = False,
         as_json: Annotated[bool, typer.Option("--json", help="With --metrics: one JSON object per metric event "
                                               "(every metric the line gave) on stdout")] = False) -> None:
    """Print a run's log; --follow keeps going until it ends (Ctrl-C stops following, not the run). A job's
    nodes are merged, each line prefixed with its node's rank."""
    from ..watch import log_view
    from ..watch.metrics_view import as_recorded

    if as_json and not metrics:
        from ..errors import InputError

        raise InputError("--json prints metric events, and needs --metrics", hint="orch logs --metrics --json")
    if follow:
        after_answer.goes_on()  # until the run ends: no later command waits for its end to find a keeper
    metric_writer = functools.partial(_metric_writer, as_json=as_json)
    settings = common.settings(ctx, lenient=True)
    settings = settings if follow else common.read_only(settings)  # a first read is bounded by read_timeout
    grp = _job_of(settings, target, ct, experiment, trust_new_host)
    if grp is not None:
        from . import job

        write = metric_writer(settings) if metrics else _raw_writer()
        job.logs(settings, grp, experiment, write=write, lines=lines, follow=follow,
                 node=0 if metrics and node is None else node)
        _finish(write)
        return None
    with common.registry(settings) as reg:
        tgt, exp, run_registry = log_view.find_run(
            settings, reg, experiment, common.single(target, ct),
            lambda name, ct_: common.target(settings, name, ct_, trust=trust_new_host))
        if experiment is None:
            _say_latest(settings, reg, tgt, exp.id)
    nodes = log_view.job_nodes(tgt, exp)  # a Slurm job over several nodes: a log per node, in its run folder
    if node is not None and nodes < 2:
        from ..errors import InputError

        raise InputError("--node names a node of a job over several nodes, and this is one target",
                         hint="drop --node (or name the job's nodes: orch logs --ct A --ct B --node 1)")
    if follow:
        render.say(f"orch: following experiment {exp.id} on {tgt.label} (Ctrl-C stops following, not the run)")
    recorded = as_recorded(settings, exp)
    write = metric_writer(recorded) if metrics else _raw_writer()
    try:
        state = None
        if metrics and nodes == 1 and not recorded.metrics.patterns:  # the supervisor's series, where it keeps one
            state = log_view.read_series(settings, tgt, exp.id, run_registry,
                                         functools.partial(common.registry, settings), emit=write.event,
                                         follow=follow, tail_lines=lines)
        if state is not None:
            pass
        elif nodes > 1:
            state = log_view.read_nodes(settings, tgt, exp, run_registry, functools.partial(common.registry, settings),
                                        write=write, notice=lambda m: render.say(f"orch: {m}"), follow=follow,
                                        tail_lines=lines, node=0 if metrics and node is None else node)
        else:
            state = log_view.read(settings, tgt, exp.id, run_registry, functools.partial(common.registry, settings),
                                  write=write, notice=lambda m: render.say(f"orch: {m}"), follow=follow,
                                  tail_lines=lines)
    except KeyboardInterrupt:
        render.say("orch: stopped following (the run goes on)")
        raise typer.Exit(0) from None
    _finish(write)
    if follow:
        render.say(f"orch: experiment {exp.id} {state.get('state')} (exit code {state.get('exit_code')})")


def _say_latest(settings, reg, tgt, acting: int) -> None:
    """Several runs of the project side by side on the target: which one a bare command acts on, on stderr."""
    from ..records import side_by_side

    told = side_by_side.note(settings.project.name, [e.id for e in side_by_side.live(reg, tgt, settings.project.name)],
                             acting)
    if told:
        render.say(f"orch: {told}")


def _job_of(settings, target, ct, experiment, trust: bool):
    """The job's nodes when the flags, the current target or ``-e N`` name a job over several nodes."""
    if experiment is not None and not target and not ct:
        with common.registry(settings) as reg:
            exp = reg.get(experiment)
        return common.job_group(settings, exp, trust=trust) if exp.nodes else None
    return common.group(settings, target, ct, trust=trust)


def _raw_writer():
    out = sys.stdout.buffer

    def write(data: bytes) -> None:
        out.write(data)
        out.flush()
    return write


def _metric_writer(settings, as_json: bool = False):
    from ..watch.log_view import MetricLines

    return MetricLines(settings.metrics.patterns, render.out, as_json=as_json)


def _finish(write) -> None:
    """After a ``--metrics`` read: the log's last line, then, on stderr, that no line held a metric (if so)."""
    note = write.finish() if hasattr(write, "finish") else None
    if note:
        render.say(f"orch: {note}")


def register(app: typer.Typer) -> None:
    app.command()(logs)
