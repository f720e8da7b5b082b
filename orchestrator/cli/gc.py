"""orch gc: free a target's old revisions, blobs, envs and run folders (never checkpoints or their trash)."""

from __future__ import annotations

import functools
from typing import Annotated

import typer

from . import common, render
from .common import CtsOpt, JsonOpt, TargetsOpt, TrustOpt

KeepOpt = Annotated[int, typer.Option("--keep", min=0, max=1 << 20,
                                      help="Keep this project's last N experiments' runs and revisions")]
DryOpt = Annotated[bool, typer.Option("--dry-run", help="List what would be removed, with sizes; change nothing")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation")]


def _show(res: dict, label: str) -> None:
    items = res["items"]
    if not items:
        render.out(f"nothing to remove on {label}")
    else:
        render.table(f"{'would remove' if res['dry_run'] else 'removed'} on {label}", ["kind", "name", "size"],
                     [[i["kind"], i["name"] + (f" ({i['why']})" if i.get("why") else ""), render.size(i["bytes"])]
                      for i in items])
        verb = "would free" if res["dry_run"] else "freed"
        render.out(f"{verb} {render.size(res['freed'])} ({res['freed']} bytes) in {len(items)} item(s)")
    _show_kept(res)


def _show_kept(res: dict) -> None:
    """Why each thing that stays stays, and what no longer matches what was pushed."""
    lines = [f"  {k['kind']} {k['name']}: {k['why']}" for k in res.get("kept", [])]
    if res.get("kept_blobs"):
        lines.append(f"  {res['kept_blobs']} blob(s): files of the revisions that stay")
    if lines:
        render.out("keeps:")
        for line in lines:
            render.out(line)
    for c in res.get("changed", []):
        render.out(f"changed: revision {c['revision']}: {c['path']}: {c['why']} since it was pushed (a run wrote "
                   "into it); gc stops trusting it: the next deploy of this code sends the file again and rebuilds "
                   "the revision, and restarting it as it is is refused")


def gc(ctx: typer.Context, keep: KeepOpt = 5, dry_run: DryOpt = False, yes: YesOpt = False,
       target: TargetsOpt = None, ct: CtsOpt = None, trust_new_host: TrustOpt = False,
       as_json: JsonOpt = False) -> None:
    """Remove revisions, blobs and run folders that no live run and none of the last N experiments use."""
    from ..launch.target_gc import collect

    settings = common.settings(ctx)
    tgt = common.target(settings, *common.one_node(target, ct, "gc"), trust=trust_new_host)

    def confirm(plan: dict) -> None:
        if not as_json:
            _show(plan, tgt.label)
        render.confirm_or_refuse(yes, f"remove these {len(plan['items'])} item(s) from {tgt.label}?",
                                 f"nothing was removed from {tgt.label}")

    plan, res = collect(settings, tgt, functools.partial(common.registry, settings), keep=keep, dry_run=dry_run,
                        confirm=confirm)
    if res is None:
        return render.print_json(plan) if as_json else _show(plan, tgt.label)
    if as_json:
        render.print_json(res)
    else:
        render.out(f"freed {render.size(res['freed'])} ({res['freed']} bytes) on {tgt.label}")


def register(app: typer.Typer) -> None:
    app.command()(gc)
