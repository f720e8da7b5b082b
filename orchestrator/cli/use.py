"""orch use: show or set the project's current target, where bare commands act."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from . import common, render
from .common import CtsOpt


def use(ctx: typer.Context,
        name: Annotated[Optional[str], typer.Argument(help="Target name from orch.toml")] = None,
        ct: CtsOpt = None) -> None:
    """Make a target the current one (a deploy with --ct/--target does this too); alone: show it. Several
    CTs (repeated --ct) make a job's nodes current."""
    from ..reach import current
    from ..reach.targets import check_cts

    settings = common.settings(ctx)
    check_cts(settings, ct or [], render.say)  # a CT that does not exist is refused when the API can say so
    if name is None and len(ct or []) > 1:
        grp = common.group(settings, None, ct, resolve=False)
        common.remember_group(settings, grp)
        render.out(f"current target: {grp.label}; bare status, logs, restart and stop act on the job")
        return
    ct = (ct or [None])[0]
    if name is None and ct is None:
        grp = common.group(settings, None, None, resolve=False)
        if grp is not None:
            render.out(f"current target: {grp.label} (a job's nodes, chosen by a deploy or orch use)")
            return
        tgt = common.target(settings, None, None, resolve=False)
        why = "chosen by a deploy or orch use" if current.load(settings.state_dir) else \
            "default_target in orch.toml"
        render.out(f"current target: {tgt.label} (target {tgt.name}, {why})")
        return
    tgt = common.target(settings, name, ct, resolve=False)
    common.remember(settings, name, ct, tgt)
    render.out(f"current target: {tgt.label} (target {tgt.name}); bare status, logs, restart, stop and "
               "checkpoints act on it")


def register(app: typer.Typer) -> None:
    app.command()(use)
