"""orch doctor: is the target fit to train on (GPU driver and devices, /dev/shm, space, tools, clock)?"""

from __future__ import annotations

import typer

from . import common, render
from .common import CtOpt, JsonOpt, TargetOpt, TrustOpt

MARK = {"ok": "ok", "warn": "WARN", "fail": "FAIL"}


def doctor(ctx: typer.Context, target: TargetOpt = None, ct: CtOpt = None, as_json: JsonOpt = False,
           trust_new_host: TrustOpt = False) -> None:
    """Check the target: GPU driver (node vs CT), device nodes and cgroup rules, torch, /dev/shm, space,
    python, tmux and the clock. Each problem comes with the command that fixes it; nothing is changed.
    Exits 6 when a check fails."""
    from ..watch.doctor import examine

    settings = common.settings(ctx)
    tgt = common.target(settings, target, ct, trust=trust_new_host)
    report = examine(settings, tgt)
    if as_json:
        render.print_json(report)
    else:
        render.out(f"orch doctor: {report['target']}")
        width = max((len(f["check"]) for f in report["findings"]), default=0)
        for f in report["findings"]:
            render.out(f"  {MARK[f['status']]:<4}  {f['check']:<{width}}  {f['reason']}")
            if f["fix"] and f["status"] != "ok":
                render.out(f"  {'':<4}  {'':<{width}}  fix: {f['fix']}")
        counts = {s: sum(f["status"] == s for f in report["findings"]) for s in ("ok", "warn", "fail")}
        render.out(f"{counts['fail']} failed, {counts['warn']} warnings, {counts['ok']} ok")
    if report["status"] == "fail":
        raise typer.Exit(6)


def register(app: typer.Typer) -> None:
    app.command()(doctor)
