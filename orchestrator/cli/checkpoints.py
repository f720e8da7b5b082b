"""orch checkpoints list|clean|restore|purge: the checkpoint folder and its trash."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from . import common, render
from .common import CtsOpt, JsonOpt, TargetsOpt, TrustOpt

app = typer.Typer(help="Checkpoints on a target, and the trash that makes cleaning undoable.",
                  no_args_is_help=True)
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation")]


class _Checkpoints:
    """One connection to the target for the whole command: read the folder, then change it under the lock."""

    def __init__(self, ctx: typer.Context, target: str | None, ct: int | None, trust: bool,
                 read_only: bool = False) -> None:
        from ..records.reconcile import client_for

        self.settings = common.settings(ctx)
        self.target = common.target(self.settings, target, ct, trust=trust)
        self.client = client_for(self.settings, self.target, read_only=read_only)
        self.base = {"path": self.target.checkpoints, "configured": self.target.checkpoints}

    def reconcile(self, *also: object) -> list:
        """The registry's unsettled rows brought up to date, in one agent call with the ops ``also``."""
        from ..records.reconcile import reconcile

        with common.registry(self.settings) as reg:
            return reconcile(self.settings, self.target, reg, self.client, also=list(also))  # type: ignore[arg-type]

    def inventory(self, retention: bool = False) -> dict:
        from ..reach.agent_client import Op

        max_gb = self.settings.trash.max_gb
        keep = {"keep": self.settings.trash.keep, "max_bytes": int(max_gb * (1 << 30)) if max_gb else None}
        return self.reconcile(Op("ckpt_inventory", {**self.base, "ignore": self.settings.checkpoints.ignore,
                                                    **(keep if retention else {})}))[0]

    def change(self, op: str, **args: object) -> dict:
        from ..reach.agent_client import Op

        return self.client.call([Op(op, {**self.base, **args})], lock=self.settings.run.lock_timeout,
                                what=f"checkpoints {op}")[0]

    def __enter__(self) -> "_Checkpoints":
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.transport.close()


@app.command("list")
def list_(ctx: typer.Context, target: TargetsOpt = None, ct: CtsOpt = None, as_json: JsonOpt = False,
          trust_new_host: TrustOpt = False) -> None:
    """What the checkpoint folder and its trash hold; of each node, for a job's nodes."""
    named = [(t, None) for t in target or []] + [(None, c) for c in ct or []]
    if len(named) > 1:
        invs = [_list_one(ctx, name, num, as_json, trust_new_host) for name, num in named]
        if as_json:
            render.print_json(invs)
        return
    inv = _list_one(ctx, *common.single(target, ct), as_json, trust_new_host)
    if as_json:
        render.print_json(inv)


def _list_one(ctx: typer.Context, target: str | None, ct: int | None, as_json: bool, trust: bool) -> dict:
    with _Checkpoints(ctx, target, ct, trust, read_only=True) as ck:
        inv = ck.inventory()
    inv["target_label"] = ck.target.label
    if as_json:
        return inv
    render.out(f"{inv['path']} on {ck.target.label}: {inv['files']} file(s), {render.size(inv['bytes'])}, "
               f"newest {inv['newest'] or '-'}")
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
def clean(ctx: typer.Context, target: TargetsOpt = None, ct: CtsOpt = None, yes: YesOpt = False,
          trust_new_host: TrustOpt = False) -> None:
    """Move the checkpoints to the trash now (refused while a run writes to them)."""
    with _Checkpoints(ctx, *common.one_node(target, ct, "checkpoints clean"), trust_new_host) as ck:
        inv = ck.inventory(retention=True)
        if not inv["files"]:
            render.out(f"{inv['path']} is empty: nothing to move")
            return
        doomed = [d["entry"] for d in inv.get("retention", [])]
        if doomed:
            render.say(f"trash retention ([trash] keep / max_gb) will PERMANENTLY DELETE {', '.join(doomed)}")
        _confirm(yes, f"move {inv['files']} file(s), {render.size(inv['bytes'])}, from {inv['path']} to the trash"
                      + (f" and delete {len(doomed)} older trash entr{'y' if len(doomed) == 1 else 'ies'}?"
                         if doomed else "?"))
        from ..launch.operations import checkpoint_writer

        runs = ck.client.one("status", project=ck.settings.project.name, tail=False, gpus=False)["runs"]
        writer = checkpoint_writer(runs, inv)
        max_gb = ck.settings.trash.max_gb
        res = ck.change("ckpt_trash", label=f"exp{writer.id}" if writer is not None else "manual",
                        keep=ck.settings.trash.keep, retention_allowed=doomed,
                        max_bytes=int(max_gb * (1 << 30)) if max_gb else None)
    render.out(f"moved {res['moved']} file(s) on {ck.target.label} to {res['entry_path']} "
               f"(orch checkpoints restore {res['entry']})")
    for p in res.get("purged", []):
        render.out(f"trash retention: deleted {p['entry']} ({render.size(p['bytes'])})")


@app.command()
def restore(ctx: typer.Context, entry: Annotated[str, typer.Argument(help="Trash entry name (see list)")],
            target: TargetsOpt = None, ct: CtsOpt = None, trust_new_host: TrustOpt = False) -> None:
    """Move a trash entry's files back into the checkpoint folder (never overwrites)."""
    with _Checkpoints(ctx, *common.one_node(target, ct, "checkpoints restore"), trust_new_host) as ck:
        ck.reconcile()
        res = ck.change("ckpt_restore", name=entry)
    render.out(f"restored {res['restored']} item(s) from {entry} into {res['path']} on {ck.target.label}")


@app.command()
def purge(ctx: typer.Context, entries: Annotated[Optional[list[str]], typer.Argument(help="Trash entries")] = None,
          all_: Annotated[bool, typer.Option("--all", help="Every trash entry")] = False,
          target: TargetsOpt = None, ct: CtsOpt = None, yes: YesOpt = False, trust_new_host: TrustOpt = False) -> None:
    """Delete trash entries for good (asks first)."""
    from ..errors import InputError

    with _Checkpoints(ctx, *common.one_node(target, ct, "checkpoints purge"), trust_new_host) as ck:
        inv = ck.inventory()
        names = [e["name"] for e in inv["entries"]] if all_ else list(entries or [])
        if not names:
            raise InputError("name the trash entries to delete, or pass --all", hint="see orch checkpoints list")
        total = sum(e["bytes"] for e in inv["entries"] if e["name"] in names)
        _confirm(yes, f"PERMANENTLY delete {len(names)} trash entr{'y' if len(names) == 1 else 'ies'} "
                      f"({render.size(total)})?")
        res = ck.change("ckpt_purge", names=names)
    for p in res["purged"]:
        render.out(f"deleted {p['entry']} ({render.size(p['bytes'])})")


def _confirm(yes: bool, question: str) -> None:
    from ..errors import InputError

    if yes:
        return
    if not render.interactive():
        raise InputError("refusing without confirmation", hint="rerun with --yes, or in a terminal to be asked")
    if not render.confirm(question):
        raise InputError("cancelled: nothing was changed")
