"""orch experiments list|show|compare|plot|export|rebuild: the registry, read, exported, rebuilt."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from . import common, render
from .common import ID_MAX, IdArg, IdsArg, JsonOpt

app = typer.Typer(help="The recorded experiments of this project.", no_args_is_help=True)


@app.command("list")
def list_(ctx: typer.Context, as_json: JsonOpt = False,
          target: Annotated[Optional[str], typer.Option("--target", "-t", help="Only this target")] = None,
          limit: Annotated[int, typer.Option("--limit", min=1, max=ID_MAX,
                                             help="At most this many, newest first")] = 50) -> None:
    """Experiments, newest first."""
    settings = common.settings(ctx)
    from ..records import listing

    with common.registry(settings) as reg:
        rows, total = (listing.public_records if as_json else listing.rows)(reg, target=target, limit=limit)
    if as_json:
        render.print_json_records(rows)
    elif not rows:
        render.out("no experiments yet (orch deploy starts one)")
    else:
        render.grid(["id", "status", "exit", "target", "revision", "batching", "sweep", "parent", "created",
                     "message"],
                    [[e["id"], _status(e), e["exit_code"], e["target"], e["revision"][:10], e["strategy"], e["sweep"],
                      e["parent"], render.when(e["created"]), e["message"]] for e in rows])
        if any(e["orphaned"] for e in rows):
            render.say("orphaned: the orch that launched it was killed; the next command that reaches its target "
                       "(orch status) records what became of it")
    if total > len(rows):
        render.say(f"orch: the newest {len(rows)} of {total} experiments{f' on {target}' if target else ''}; "
                   f"{total - len(rows)} more (--limit {total} lists them all)")


def _status(row: dict) -> str:
    """A launch that never finished says so: ``orphaned`` (not yet settled) or ``failed (interrupted)``."""
    if row["orphaned"]:
        return "orphaned"
    if row["status"] == "failed" and "interrupted" in (row["error"] or ""):
        return "failed (interrupted)"
    return row["status"]


@app.command()
def show(ctx: typer.Context, exp_id: IdArg, as_json: JsonOpt = False,
         refresh: Annotated[bool, typer.Option("--refresh/--no-refresh", help="Read the log first when the stored "
                                               "metrics are incomplete (connects to its target)")] = True) -> None:
    """One experiment's full record: revision, command, target, batching, checkpoints, outcome, metrics."""
    settings = common.settings(ctx)
    from ..records.experiments import record
    from ..watch.metrics_view import STATUS_BUDGET_S

    with common.registry(settings) as reg:
        reg.get(exp_id)
        _refreshed(settings, reg, [exp_id], refresh, budget_s=STATUS_BUDGET_S)  # the summary, exact; the rest next
        exp = reg.get(exp_id)
        data = record(reg, exp)
        metrics = reg.metrics(exp_id)
    from ..records.experiments import FINAL

    read = ((metrics or {}).get("summary") or {}).get("_state") or {}
    if exp.status in FINAL and exp.status != "failed" and not metrics_complete(settings, exp, metrics):
        data["metrics_stale"] = True
        if read.get("behind") and refresh:  # read in part within the budget: the rest by the next show or status
            data["metrics_read"] = {"offset": read.get("offset"), "size": read.get("size")}
    if as_json:
        render.print_json(data)
        return
    from ..records.experiments import command_line

    render.out(f"experiment {exp.id}: {exp.status}" + (f" (exit code {exp.exit_code})" if exp.exit_code is not None
                                                        else ""))
    for label, value in (("message", exp.message), ("target", exp.target), ("revision", exp.revision),
                         ("git", f"{exp.git_commit or '-'}{' (dirty)' if exp.git_dirty else ''}"),
                         ("command", command_line(exp.command)), ("secrets", ", ".join(exp.secret_names)),
                         ("env", exp.env and f"{exp.env['hash']} ({len(exp.env.get('packages') or {})} packages: "
                                             "orch env show " + exp.env["hash"] + ")"),
                         ("parent", exp.parent),
                         ("created", render.when(exp.created)), ("started", render.when(exp.started)),
                         ("ended", render.when(exp.ended)),
                         ("how", None if exp.end_reason == f"exit code {exp.exit_code}" else exp.end_reason),
                         ("checkpoints", f"{exp.checkpoints_action or '-'}"
                                         + (f" -> {exp.checkpoints_entry}" if exp.checkpoints_entry else "")),
                         ("error", exp.error)):
        if value not in (None, ""):
            render.out(f"  {label:12} {value}")
    if exp.nodes:
        render.out("  nodes:")
        for n in exp.nodes:
            code = f" (exit code {n['exit_code']})" if n.get("exit_code") is not None else ""
            how = f", {n['reason']}" if n.get("reason") and n.get("state") != "running" else ""
            owed = f" [{n['stop']}]" if n.get("stop_pending") and n.get("stop") else ""
            render.out(f"    {n.get('rank')}: {n.get('label')}: {n.get('state') or 'not started'}{code}{how}"
                       f", ended {render.when(n.get('ended'))}{owed}")
    if exp.attempts:
        render.out("  attempts:")
        for a in exp.attempts:
            code = "-" if a.get("exit_code") is None else a["exit_code"]
            resumed = f", resumed from {a['resumed_from']}" if a.get("resumed_from") and a.get("attempt") else ""
            reason = a.get("reason") or "running"
            how = "" if reason == f"exit code {code}" else f", {reason}"  # the reason may be the exit code itself
            render.out(f"    {a.get('attempt', 0) + 1}: {render.when(a.get('started'))}, exit code {code}{how}"
                       f"{resumed}")
    render.out("  batching:" + ("" if exp.batching else "     none (the project has no [batching])"))
    for k, v in exp.batching.items():
        if v is not None:
            render.out(f"    {k:18} {v}")
    if exp.batching_plan:
        render.out("  planned (from the sample lengths):")
        for k, v in exp.batching_plan.items():
            render.out(f"    {k:18} {v}")
    for n in exp.nodes or []:  # a job: each node's record (metrics above are node 0's log)
        code = f" (exit code {n['exit_code']})" if n.get("exit_code") is not None else ""
        render.out(f"  node {n['rank']}       {n.get('label')} {n.get('address')}: {n.get('state')}{code}"
                   + (f" [{n['reason']}]" if n.get("reason") else ""))
    for k in ("node", "ct", "address", "access"):
        if exp.target_info.get(k) is not None:
            render.out(f"  {k:12} {exp.target_info[k]}")
    ct_config = exp.target_info.get("ct_config") or {}
    for k in ("cores", "memory", "mounts", "devices", "gpus"):
        if ct_config.get(k) not in (None, [], {}):
            render.out(f"  ct {k:9} {ct_config[k]}")
    given = {g.get("uuid") for g in exp.gpus or []}
    for g in (exp.target_info.get("agent") or {}).get("gpus") or []:
        mark = " (given to the run)" if g.get("uuid") in given else ""
        render.out(f"  gpu          {g.get('index')}: {g.get('name')}{mark}")
    for line in metric_lines(data["metrics"]):
        render.out(f"  {line}")
    if data.get("metrics_read"):
        render.say(f"orch: experiment {exp.id}'s series read up to byte {data['metrics_read']['offset']} of "
                   f"{data['metrics_read']['size']} (its last step and metrics are its supervisor's, exact); "
                   f"orch experiments show {exp.id} or compare reads on")
    elif data.get("metrics_stale"):
        render.say(f"orch: experiment {exp.id}'s metrics may be behind its log (its target was not read); "
                   f"orch experiments show {exp.id} reads it, orch status -e {exp.id} too")


RefreshOpt = Annotated[bool, typer.Option("--refresh/--no-refresh", help="Read the logs of experiments whose "
                                          "metrics are missing or incomplete (connects to their targets)")]


def metrics_complete(settings, exp, stored) -> bool:
    """True when ``stored`` covers the experiment's whole log, read as it would be read now."""
    from ..watch.metrics_view import is_complete, reading_key

    return is_complete(stored, reading_key(settings, exp))


def _refreshed(settings, reg, ids: list[int], refresh: bool, budget_s: float | None = None) -> None:
    """Bring the experiments' metrics up to date first; complete ones cost no connection. ``budget_s``: each read
    bounded as status's is (what only shows the summary)."""
    if not refresh:
        return
    from ..watch.metrics_view import refresh_stale, target_flags

    def resolve(exp):
        name, ct = target_flags(settings, exp)
        return common.target(settings, name, ct)

    exps = [reg.get(i) for i in ids]
    refresh_stale(settings, reg, exps, resolve, notice=lambda m: render.say(f"orch: {m}"), budget_s=budget_s)


@app.command()
def compare(ctx: typer.Context, ids: IdsArg,
            as_json: JsonOpt = False, refresh: RefreshOpt = True) -> None:
    """Config differences (batching first) and metrics side by side."""
    from ..watch.compare import compare as build

    settings = common.settings(ctx)
    with common.registry(settings) as reg:
        if len(ids) >= 2:
            _refreshed(settings, reg, ids, refresh)
        result = build(reg, ids)
    if as_json:
        render.print_json(result)
        return
    head = ["", *[f"exp {i}" for i in ids]]
    render.table("differences", head, [[r["key"], *r["values"]] for r in result["diff"]] or [["(none)"]])
    for c in result["packages"]:
        render.out(f"packages of exp {c['id']} against exp {c['against']}: {', '.join(c['changes'])}")
    render.table("metrics", head, [[r["metric"], *r["values"]] for r in result["metrics"]])


@app.command()
def plot(ctx: typer.Context,
         out: Annotated[Path, typer.Option("--out", "-o", help="Image to write (.png, .svg, .pdf)")],
         ids: Annotated[Optional[list[int]], typer.Argument(metavar="ID...", min=1, max=ID_MAX,
                                                            help="One or more ids")] = None,
         metric: Annotated[Optional[str], typer.Option("--metric", "-m", help="loss (default), throughput, or "
                                                       "any metric the log gave (val_loss, lr, ppl: experiments "
                                                       "show lists them)")] = None,
         sweep: Annotated[Optional[str], typer.Option("--sweep", help="Every variant of this sweep; a search's "
                                                      "trials as parallel coordinates and a scatter a parameter, "
                                                      "unless --metric asks for curves")] = None,
         refresh: RefreshOpt = True) -> None:
    """Draw the experiments' loss, throughput or any other metric against the step (needs the plot extra)."""
    from ..errors import InputError
    from ..watch.metrics import Series
    from ..records.plots import draw, series_key, throughput_series
    from . import sweep_search

    settings = common.settings(ctx)
    if sweep is not None and not ids and metric is None and sweep_search.is_search(settings, sweep):
        render.out(f"wrote {sweep_search.plot(settings, sweep, out)}")
        return
    metric = metric or "loss"
    key = series_key(metric)
    with common.registry(settings) as reg:
        if sweep is not None:
            ids = sorted({*(ids or []), *(e.id for e in reg.list(sweep=sweep))})
            if not ids:
                raise InputError(f"no sweep {sweep!r} in this project's registry",
                                 hint="orch experiments list shows each experiment's sweep")
        if not ids:
            raise InputError("name the experiments to plot, or --sweep S", hint="e.g. orch experiments plot 3 4 -o a.png")
        _refreshed(settings, reg, ids, refresh)
        if key == "tok_s":
            key = throughput_series([(reg.metrics(i) or {}).get("series", {}) for i in ids])
        curves = []
        for i in ids:
            exp = reg.get(i)
            stored = (reg.metrics(i) or {}).get("series", {})
            if key not in stored:
                raise InputError(f"experiment {i} has no {metric} series (its log showed no {key} values)",
                                 hint=f"orch logs -e {i} shows what it printed; [metrics] patterns in orch.toml "
                                      "teach orch other formats")
            curves.append((f"exp {i}" + (f": {exp.message}" if exp.message else ""),
                           Series.from_dict(stored[key]).points()))
    path = draw(curves, metric, out, key)
    render.out(f"wrote {path}")


@app.command()
def export(ctx: typer.Context,
           uri: Annotated[Optional[str], typer.Argument(metavar="URI", help="The MLflow tracking URI (default: "
                                                        "[mlflow] tracking_uri, else MLFLOW_TRACKING_URI, else "
                                                        "sqlite:///.orch/mlflow.db)")] = None,
           to_mlflow: Annotated[bool, typer.Option("--mlflow", help="Write each experiment as an MLflow run "
                                                   "(needs the mlflow extra)")] = False,
           tensorboard: Annotated[Optional[Path], typer.Option("--tensorboard", metavar="DIR", help="Write each "
                                                               "experiment as a TensorBoard run in DIR/exp-<id> "
                                                               "(needs the tensorboard extra)")] = None,
           ids: Annotated[Optional[list[int]], typer.Option("--experiment", "-e", min=1, max=ID_MAX,
                                                            help="Only this experiment (repeat it); default: "
                                                                 "all")] = None,
           log: Annotated[bool, typer.Option("--log/--no-log", help="Upload each run's log (read from its "
                                             "target)")] = True,
           refresh: RefreshOpt = True, as_json: JsonOpt = False) -> None:
    """Write experiments to a tracker, once each: exporting again updates their runs, never duplicates them."""
    from ..errors import InputError

    if not to_mlflow and tensorboard is None:
        raise InputError("orch experiments export needs a destination", hint="orch experiments export --mlflow "
                         "[URI] writes the experiments as MLflow runs, --tensorboard DIR as TensorBoard runs")
    if uri is not None and not to_mlflow:
        raise InputError(f"the URI {uri!r} is an MLflow tracking URI, and --mlflow is not given",
                         hint="add --mlflow to export to MLflow too, or leave the URI out")
    settings = common.settings(ctx)
    done = {}
    if tensorboard is not None:
        done["tensorboard"] = _to_tensorboard(settings, tensorboard, ids, refresh, as_json)
    if to_mlflow:
        done["mlflow"] = _to_mlflow(settings, uri, ids, log, refresh and tensorboard is None, as_json)
    if as_json:
        render.print_json(done if len(done) > 1 else next(iter(done.values())))


def _to_tensorboard(settings, folder: Path, ids: list[int] | None, refresh: bool, as_json: bool) -> dict:
    from ..watch.metrics_view import target_flags
    from ..watch.series_read import records_of
    from ..watch.tensorboard_export import export as run

    def resolve(exp):
        return common.target(settings, *target_flags(settings, exp))

    with common.registry(settings) as reg:
        result = run(reg, ids, folder.expanduser().absolute(),
                     refresh=(lambda exps: _refreshed(settings, reg, [e.id for e in exps], True)) if refresh else None,
                     series=(lambda exps: records_of(settings, reg, exps, resolve, lambda m: render.say(f"orch: {m}")))
                     if refresh else None)
    if as_json:
        return result
    for r in result["runs"]:
        render.out(f"experiment {r['experiment']}: TensorBoard run {r['run']} ({r['points']} new scalar points)")
    render.out(f"exported {len(result['runs'])} experiment(s) to {result['dir']}; "
               f"see them with: tensorboard --logdir {result['dir']}")
    return result


def _to_mlflow(settings, uri: str | None, ids: list[int] | None, log: bool, refresh: bool, as_json: bool) -> dict:
    from ..watch.mlflow_export import export as run, tracking_uri
    from ..watch.metrics_view import target_flags
    from ..watch.series_read import records_of

    def resolve(exp):
        return common.target(settings, *target_flags(settings, exp))

    with common.registry(settings) as reg:
        result = run(settings, reg, ids, uri=tracking_uri(settings, uri),
                     refresh=(lambda exps: _refreshed(settings, reg, [e.id for e in exps], True)) if refresh else None,
                     resolve=resolve if log else None, notice=render.say,
                     series=(lambda exps: records_of(settings, reg, exps, resolve, lambda m: render.say(f"orch: {m}")))
                     if refresh else None)
    if as_json:
        return result
    for r in result["runs"]:
        render.out(f"experiment {r['experiment']}: MLflow run {r['run_id']} ({r['run']}; {r['params']} new params, "
                   f"{r['metrics']} new metric points; log: {r['log']})")
        if r["params_kept"]:
            render.say(f"orch: experiment {r['experiment']}: MLflow keeps the params it has for "
                       f"{', '.join(r['params_kept'])} (an MLflow param never changes)")
    render.out(f"exported {len(result['runs'])} experiment(s) to {result['uri']}, MLflow experiment "
               f"{result['experiment']!r}")
    return result


@app.command()
def rebuild(ctx: typer.Context, as_json: JsonOpt = False,
            registry_id: Annotated[Optional[str], typer.Option("--registry", help="This clone's registry id (the "
                                                               "prefix of its run folders), when several clones "
                                                               "ran on the targets")] = None) -> None:
    """Recreate a corrupt registry from the run folders on the targets (the corrupt file is kept aside)."""
    from ..errors import InputError
    from ..records.rebuild import rebuild as run

    if registry_id is not None and (len(registry_id) != 12 or set(registry_id) - set("0123456789abcdef")):
        raise InputError(f"--registry must be 12 lowercase hex digits, not {registry_id!r}",
                         hint="it is the prefix of this clone's run folders on a target: runs/<registry id>-<id>")
    settings = common.settings(ctx)
    result = run(settings, lambda name, ct: common.target(settings, name, ct), registry_id=registry_id,
                 notice=render.say)
    if as_json:
        render.print_json(result)
        return
    ids = ", ".join(map(str, result["experiments"])) or "none"
    render.out(f"rebuilt {result['path']} from the run folders on {', '.join(result['asked']) or 'no target'}: "
               f"experiments {ids}")
    if result["kept_aside"]:
        render.out(f"the unreadable registry is kept as {result['kept_aside']}")
    if result["missed"]:
        render.say(f"orch: not asked: {', '.join(result['missed'])}; their experiments are not in the new registry "
                   f"(to rebuild again once they answer, move {result['path']} aside first)")


def _num(v: Any) -> str:
    """A metric for people: four significant digits (``0.0006361``, ``2.346``, ``1.523e+04``), counts whole."""
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return str(int(v))
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def metric_lines(summary: dict) -> list[str]:
    """``experiments show``'s metric lines: the step, each metric's last value once (with its best where it
    differs), the throughput and what status noted; nothing of how they were read."""
    from ..watch.metrics import better

    out = []
    if summary.get("step") is not None:
        total = summary.get("total_steps")
        out.append(f"{'step':19} {_num(summary['step'])}" + (f" of {_num(total)}" if total else ""))
    last = dict(summary.get("metrics") or {})
    best = summary.get("best") or {}
    if summary.get("loss") is not None:
        last.setdefault("loss", summary["loss"])
    if summary.get("min_loss") is not None:
        best.setdefault("loss", summary["min_loss"])
    for name in sorted(last, key=lambda n: (n != "loss", n.startswith(("val_", "test_", "summary_")), n)):
        value = last[name]
        if not isinstance(value, (int, float)):
            continue
        kept = best.get(name)
        extra = f" (best {_num(kept)}, {'highest' if better(name) == 'max' else 'lowest'})" \
            if isinstance(kept, (int, float)) and kept != value else ""
        out.append(f"metric {name:12} {_num(value)}{extra}")
    if summary.get("throughput"):
        out.append(f"{'throughput':19} {summary['throughput']}")
    if summary.get("eta"):
        out.append(f"{'eta':19} {summary['eta']}")
    for note in summary.get("notes") or []:
        out.append(f"{'note':19} {note}")
    return out
