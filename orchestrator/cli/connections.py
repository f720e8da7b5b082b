"""orch connections list|close: the SSH connections the connection keeper holds for later commands, and the
warm orch processes (each side is asked for its own)."""

from __future__ import annotations

import time
from typing import Annotated, Optional

import typer

from . import render
from .common import JsonOpt

app = typer.Typer(help="SSH connections held open between commands ([ssh] persist).", no_args_is_help=True)


@app.command("list")
def list_(as_json: JsonOpt = False) -> None:
    """The keepers of this user and the connections each holds."""
    from ..reach.keeper import client
    from ..warm import client as warm_client

    found = client.keepers()
    warm = warm_client.processes()
    if as_json:
        render.print_json({"keepers": found, "warm": warm})
        return
    for item in warm:
        render.out(f"warm orch process {item['pid']} (commands start in a fork of it)"
                   + ("" if item["mine"] else ", of another home or orch installation"))
    rows = [[f"{k['pid']}" + ("" if k["mine"] else " (not this home's)"),
             c["target"] + (f" ({c['role']})" if c.get("role") else ""),
             "open" if c["alive"] else "closed", render.ago(time.time() - c["since"]),
             render.ago(time.time() - c["last"]), c["commands"]]
            for k in found for c in k["connections"]]
    if not found and warm:
        return
    if not found:
        render.out("no connection keeper is running (the next command to an SSH target starts one)")
        return
    if not rows:
        render.out(f"{len(found)} keeper(s) running, holding no connection")
        return
    render.table("held SSH connections", ["keeper pid", "target", "state", "opened", "last used", "commands"],
                 rows)


@app.command("close")
def close(target: Annotated[Optional[str], typer.Argument(help="Only the connection to this host "
                                                             "(default: all, and the keepers exit)")] = None,
          everyone: Annotated[bool, typer.Option("--all", help="Those of every home and orch installation of "
                                                               "this user too (the socket folder is per user)")]
          = False) -> None:
    """Close this home's held connections (this orch installation's); the next command opens a new one."""
    from ..reach.keeper import client
    from ..warm import client as warm_client

    keepers = client.keepers()
    ours = sum(everyone or k["mine"] for k in keepers)
    others_keepers = len(keepers) - ours
    others_warm = 0 if everyone else sum(not w["mine"] for w in warm_client.processes())
    warm = warm_client.close(everyone) if target is None else 0
    closed = client.close(target, everyone)
    if target is not None:
        said = f"closed {closed} connection(s)"
    elif ours:
        said = f"closed {closed} connection(s); {ours} keeper(s) exited"
    else:
        said = "no connection keeper was running" + ("" if warm else ": nothing to close")
    if warm:
        said += f"; {warm} warm orch process(es) exited (the next command starts one)"
    render.out(said)
    left = [f"{n} {what}{'s' if n > 1 else ''}" for n, what in ((others_keepers, "other keeper"),
                                                                 (others_warm, "other warm process")) if n]
    if left:
        render.out(f"{' and '.join(left)} of this user, for other homes or orch installations, left running; "
                   "--all ends them")
