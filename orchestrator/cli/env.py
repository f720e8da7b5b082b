"""orch env list|show|build: the run's Python environments on a target ([env]), and which experiments use them."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from . import common, render
from .common import CtsOpt, JsonOpt, TargetsOpt, TrustOpt

app = typer.Typer(help="The run's Python environments on a target ([env] in orch.toml)", no_args_is_help=True)

HashArg = Annotated[Optional[str], typer.Argument(metavar="[HASH]",
                                                  help="An env's hash (default: the latest experiment's)")]


def _envs(ctx: typer.Context, target, ct, trust: bool) -> tuple:
    from ..launch import envs

    settings = common.read_only(common.settings(ctx))
    tgt = common.target(settings, *common.one_node(target, ct, "env"), trust=trust)
    with common.registry(settings) as reg:
        found = envs.listing(settings, tgt, reg)
        latest = reg.latest(tgt.machine, tgt.name)
    return tgt, found, latest


@app.command("list")
def list_(ctx: typer.Context, target: TargetsOpt = None, ct: CtsOpt = None, trust_new_host: TrustOpt = False,
          as_json: JsonOpt = False) -> None:
    """The envs built on the target: size, packages, and the experiments that use each."""
    tgt, found, _latest = _envs(ctx, target, ct, trust_new_host)
    if as_json:
        return render.print_json({"target": tgt.label, "envs": found})
    if not found:
        render.out(f"no environments on {tgt.label} ([env] in orch.toml builds one at the next deploy)")
        return
    render.table(f"environments on {tgt.label}", ["hash", "packages", "size", "installer", "experiments", "runs"],
                 [[e["hash"], str(len(e["packages"])), render.size(e["bytes"]), e.get("installer") or "-",
                   ", ".join(map(str, e["experiments"])) or "-", str(len(e["runs"]))] for e in found])


@app.command()
def show(ctx: typer.Context, env_hash: HashArg = None, target: TargetsOpt = None, ct: CtsOpt = None,
         trust_new_host: TrustOpt = False, as_json: JsonOpt = False) -> None:
    """One env: what it holds and who uses it."""
    from ..errors import NotFoundError

    tgt, found, latest = _envs(ctx, target, ct, trust_new_host)
    wanted = env_hash or ((latest.env or {}).get("hash") if latest is not None else None)
    if wanted is None:
        raise NotFoundError(f"the latest experiment on {tgt.label} has no environment",
                            hint="name one: orch env list shows their hashes")
    env = next((e for e in found if e["hash"] == wanted), None)
    if env is None:
        raise NotFoundError(f"no environment {wanted} on {tgt.label}",
                            hint="orch env list shows the ones there; a deploy (or orch env build) builds it")
    if as_json:
        return render.print_json({"target": tgt.label, **env})
    render.out(f"environment {env['hash']} on {tgt.label}: {env['path']} ({render.size(env['bytes'])}, "
               f"{env.get('installer') or '?'}, from {env.get('python') or '?'})")
    render.out(f"experiments: {', '.join(map(str, env['experiments'])) or '-'}")
    render.table("packages", ["name", "version"], [[k, v] for k, v in env["packages"].items()] or [["(none)", ""]])


@app.command()
def build(ctx: typer.Context, target: TargetsOpt = None, ct: CtsOpt = None, trust_new_host: TrustOpt = False,
          as_json: JsonOpt = False) -> None:
    """Build the project's [env] on each target named (repeat --ct / --target), ahead of a deploy."""
    from ..launch import envs

    from . import progress

    settings = common.settings(ctx)
    names = [(n, None) for n in target or []] + [(None, c) for c in ct or []] or [(None, None)]
    done = []
    for name, one in names:
        tgt = common.target(settings, name, one, trust=trust_new_host)
        got = envs.build(settings, tgt, echo=render.say, meter=progress.meter(as_json))
        done.append({k: v for k, v in got.items() if k != "packages"} | {"packages": len(got["packages"])})
        if not as_json:
            render.out(f"{tgt.label}: environment {got['hash']} " +
                       (f"built in {got['seconds']:.1f} s ({len(got['packages'])} packages)" if got["built"]
                        else "is there already"))
    if as_json:
        render.print_json({"built": done})


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="env")
