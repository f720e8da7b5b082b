"""Options shared by commands, and the one way a command gets settings, target and registry."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

TargetOpt = Annotated[Optional[str], typer.Option("--target", "-t", help="Target name from orch.toml")]
CtOpt = Annotated[Optional[int], typer.Option("--ct", help="Proxmox CT id (needs a [proxmox] section)")]
StartOpt = Annotated[bool, typer.Option("--start", help="Start the CT if it is stopped")]
TrustOpt = Annotated[bool, typer.Option("--trust-new-host", help="Accept and record an unknown SSH host key "
                                        "(a changed key is always refused)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print only JSON on stdout")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", help="Override a setting: section.key=value")]


def settings(ctx: typer.Context, overrides: list[str] | None = None):
    from ..config import load_settings

    from ..errors import ConfigError

    path: Path | None = (ctx.obj or {}).get("config") if ctx.obj else None
    settings = load_settings(path, overrides=overrides or [])
    if settings.config_path is None:  # records live beside orch.toml: never scatter them in random folders
        raise ConfigError(f"no orch.toml in {Path.cwd()} or any folder above it",
                          hint="run `orch init` in your project folder, or pass --config PATH")
    return settings


def target(settings, name: str | None, ct: int | None, *, start: bool = False, trust: bool = False,
           resolve: bool = True):
    from ..targets import resolve_target, target_spec
    from . import render

    if not resolve:
        return target_spec(settings, name, ct)
    confirm = render.confirm if render.interactive() else None
    return resolve_target(settings, name, ct, trust_new_host=trust, start=start, confirm=confirm)


def registry(settings):
    from ..prepare import registry_for

    return registry_for(settings)
