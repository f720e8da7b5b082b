"""orch checkpoints list|clean|restore|purge: the checkpoint folder and its trash."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from . import common, render
from .common import CtsOpt, JsonOpt, TargetsOpt, TrustOpt

app = typer.Typer(help="Checkpoints on a target, and the trash that makes cleaning undoable.",
                  no_args_is_help=True)
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation")]
ExperimentOpt = Annotated[Optional[int], typer.Option(
    "--experiment", "-e", min=1, max=common.ID_MAX,
    help="The folder of this experiment (a sweep's variant, a --beside run: its own, beside the project's)")]


def _place(ctx: typer.Context, target: str | None, ct: int | None, trust: bool) -> tuple:
    """(settings, target, the registry opener) of a command on one node."""
    settings = common.settings(ctx)
    return settings, common.target(settings, target, ct, trust=trust), lambda: common.registry(settings)


def _own(ctx: typer.Context, target: str | None, ct: int | None, trust: bool, experiment: int | None) -> tuple:
    """``_place`` and the folder ``-e`` names (None: the project's): on the target the experiment ran on, unless
    one is named."""
    if experiment is None:
        return (*_place(ctx, target, ct, trust), None)
    from .. import checkpoints
    from ..watch.metrics_view import target_flags

    settings = common.settings(ctx)
    with common.registry(settings) as reg:
        exp = reg.get(experiment)
    if target is None and ct is None:
        target, ct = target_flags(settings, exp)
    tgt = checkpoints.ran_with(common.target(settings, target, ct, trust=trust), exp)  # its folder, not today's
    return settings, tgt, lambda: common.registry(settings), checkpoints.own_folder(tgt, exp.id, exp.checkpoints)


def _confirm():
    return render.confirm if render.interactive() else None


@app.command("list")
def list_(ctx: typer.Context, target: TargetsOpt = None, ct: CtsOpt = None, experiment: ExperimentOpt = None,
          as_json: JsonOpt = False, trust_new_host: TrustOpt = False) -> None:
    """What the checkpoint folder and its trash hold; of each node, for a job's nodes."""
    named = [(t, None) for t in target or []] + [(None, c) for c in ct or []]
    if experiment is not None:
        inv = _list_one(ctx, *common.one_node(target, ct, "checkpoints list -e"), as_json, trust_new_host,
                        experiment)
        if as_json:
            render.print_json(inv)
        return
    if len(named) > 1:
        invs = [_list_one(ctx, name, num, as_json, trust_new_host) for name, num in named]
        if as_json:
            render.print_json(invs)
        return
    inv = _list_one(ctx, *common.single(target, ct), as_json, trust_new_host)
    if as_json:
        render.print_json(inv)


def _list_one(ctx: typer.Context, target: str | None, ct: int | None, as_json: bool, trust: bool,
              experiment: int | None = None) -> dict:
    from .. import checkpoints

    inv = checkpoints.listing(*_own(ctx, target, ct, trust, experiment))
    if as_json:
        return inv
    render.out(f"{inv['path']} on {inv['target_label']}: {inv['files']} file(s), {render.size(inv['bytes'])}, "
               f"newest {inv['newest'] or '-'}")
    for v in inv.get("variants") or []:  # a sweep's variants, --beside runs: folders of their own, beside it
        render.out(f"experiment {v['exp']}'s own: {v['path']}: {v['files']} file(s), {render.size(v['bytes'])}")
    where = ", ".join(inv.get("trash_dirs") or [inv["trash"]])
    if not inv["entries"]:
        render.out(f"trash ({where}): empty")
        return inv
    render.table(f"trash ({where})", ["entry", "files", "size", "holds", "moved by", "moved"],
                 [[e["name"], e["files"], render.size(e["bytes"]), e["experiment"],
                   f"exp{e['moved_by']}" if e.get("moved_by") is not None else "-", render.when(e["created"])]
                  for e in inv["entries"]])
    return inv


@app.command()
def clean(ctx: typer.Context, target: TargetsOpt = None, ct: CtsOpt = None, experiment: ExperimentOpt = None,
          yes: YesOpt = False, trust_new_host: TrustOpt = False) -> None:
    """Move the checkpoints to the trash now (refused while a run writes to them)."""
    from .. import checkpoints

    settings, tgt, registry, path = _own(ctx, *common.one_node(target, ct, "checkpoints clean"), trust_new_host,
                                         experiment)
    res = checkpoints.clean(settings, tgt, registry, yes=yes, confirm=_confirm(), warn=render.say, path=path)
    if res["action"] == "kept":
        render.out(f"{res['path']} is empty: nothing to move")
        return
    render.out(f"moved {res['moved']} file(s) on {tgt.label} to {res['entry_path']} "
               f"(orch checkpoints restore {res['entry']})")
    for p in res.get("purged", []):
        render.out(f"trash retention: deleted {p['entry']} ({render.size(p['bytes'])})")


@app.command()
def restore(ctx: typer.Context, entry: Annotated[str, typer.Argument(help="Trash entry name (see list)")],
            target: TargetsOpt = None, ct: CtsOpt = None, experiment: ExperimentOpt = None,
            trust_new_host: TrustOpt = False) -> None:
    """Move a trash entry's files back into the checkpoint folder (never overwrites)."""
    from .. import checkpoints

    settings, tgt, registry, path = _own(ctx, *common.one_node(target, ct, "checkpoints restore"), trust_new_host,
                                         experiment)
    res = checkpoints.restore(settings, tgt, registry, entry, path)
    render.out(f"restored {res['restored']} item(s) from {entry} into {res['path']} on {tgt.label}")


@app.command()
def purge(ctx: typer.Context, entries: Annotated[Optional[list[str]], typer.Argument(help="Trash entries")] = None,
          all_: Annotated[bool, typer.Option("--all", help="Every trash entry")] = False,
          target: TargetsOpt = None, ct: CtsOpt = None, experiment: ExperimentOpt = None, yes: YesOpt = False,
          trust_new_host: TrustOpt = False) -> None:
    """Delete trash entries for good (asks first)."""
    from .. import checkpoints

    settings, tgt, registry, path = _own(ctx, *common.one_node(target, ct, "checkpoints purge"), trust_new_host,
                                         experiment)
    res = checkpoints.purge(settings, tgt, registry, entries or [], every=all_, yes=yes, confirm=_confirm(),
                            path=path)
    for p in res["purged"]:
        render.out(f"deleted {p['entry']} ({render.size(p['bytes'])})")
