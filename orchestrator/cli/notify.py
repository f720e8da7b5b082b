"""orch notify: the webhook of ``[notify]``, tried from the target."""

from __future__ import annotations

import typer

from . import common, render
from .common import CtsOpt, JsonOpt, SetOpt, TargetsOpt, TrustOpt
from ..errors import TargetError

app = typer.Typer(help="Notifications the target's supervisor sends ([notify]).", no_args_is_help=True)


@app.command("test")
def test(ctx: typer.Context, target: TargetsOpt = None, ct: CtsOpt = None, trust_new_host: TrustOpt = False,
         overrides: SetOpt = None, as_json: JsonOpt = False) -> None:
    """Send one test notification from the target and report the webhook's answer."""
    from ..launch import notify

    settings = common.settings(ctx, overrides)
    tgt = common.target(settings, *common.one_node(target, ct, "notify test"), trust=trust_new_host)
    res = notify.test(settings, tgt)
    if as_json:
        render.print_json(res)
    elif res["ok"]:
        render.out(f"sent a {res['format']} test notification from {res['target']}: HTTP {res['status']}")
    if not res["ok"]:
        status = f"HTTP {res['status']}" if res.get("status") else "no answer"
        raise TargetError(f"the webhook did not take the test notification from {res['target']} ({status}, "
                          f"{res['tries']} tries): {res['error']}",
                          hint="check [notify] url (or its secret) and that the target can reach the webhook")
