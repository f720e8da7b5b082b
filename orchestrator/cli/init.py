"""orch init: write a commented starter orch.toml; --playbooks: editable copies of the built-in playbooks."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from . import render


def init(force: Annotated[bool, typer.Option("--force", help="Overwrite an existing orch.toml (with "
                                             "--playbooks: the playbook copies only)")] = False,
         name: Annotated[str, typer.Option("--name", help="Project name")] = "",
         playbooks: Annotated[bool, typer.Option("--playbooks", help="Copy the built-in playbooks (deploy, "
                                                 "restart, stop) into playbooks/ to edit them")] = False) -> None:
    """Write a commented starter orch.toml in the working directory (--playbooks: the playbooks too)."""
    from ..launch.starter import write

    for path in write(Path.cwd(), name=name, force=force, playbooks=playbooks):
        render.out(f"wrote {path}")


def register(app: typer.Typer) -> None:
    app.command()(init)
