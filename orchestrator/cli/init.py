"""orch init: a commented starter orch.toml read from the project (its entry point, requirements, the folders
.gitignore leaves out), .orch/ and orch-pull/ kept out of git; --playbooks: editable copies of the built-in
playbooks."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from . import render


def init(force: Annotated[bool, typer.Option("--force", help="Overwrite an existing orch.toml (with "
                                             "--playbooks: the playbook copies only)")] = False,
         name: Annotated[str, typer.Option("--name", help="Project name")] = "",
         playbooks: Annotated[bool, typer.Option("--playbooks", help="Copy the built-in playbooks (deploy, "
                                                 "restart, stop) into playbooks/ to edit them")] = False,
         batching: Annotated[bool, typer.Option("--batching", help="Add a [batching] section (recorded with "
                                                "every launch, handed to the run)")] = False,
         gitignore: Annotated[bool, typer.Option("--gitignore/--no-gitignore", help="Add .orch/ and orch-pull/ "
                                                 "to .gitignore in a git project (asked on a terminal)")] = True,
         print_: Annotated[bool, typer.Option("--print", help="Print the starter orch.toml read from this folder "
                                              "on stdout; write nothing (also where an orch.toml exists)")] = False,
         ) -> None:
    """Write a commented starter orch.toml for the project in the working directory: it runs the entry point
    found there (train.py, main.py, a [project.scripts] entry, the one script with a __main__ guard)."""
    from ..launch import starter

    folder = Path.cwd()
    found = starter.survey(folder)
    if print_:
        render.out(starter.starter(found, name=name or starter.project_name(folder), batching=batching).rstrip("\n"))
        return
    for path in starter.write(folder, name=name, force=force, playbooks=playbooks, batching=batching, found=found):
        render.out(f"wrote {path}")
        if path.name == "orch.toml":
            _said(found)
    if found.git and found.unignored and gitignore:
        names = " and ".join(found.unignored)
        if sys.stdin.isatty() and sys.stdout.isatty():
            if not typer.confirm(f"add {names} to .gitignore (orch's registry and pulled files)?", default=True):
                render.out(f"left .gitignore alone: `git add -A` would commit {names}")
                return
        starter.add_to_gitignore(folder, found.unignored)
        render.out(f"added {names} to .gitignore (orch's registry and pulled files; --no-gitignore leaves it)")


def _said(found) -> None:
    """What the starter was read from, in a line each."""
    if found.command is None and found.candidates:
        render.out("no train.py or main.py at the top: [project] command is left unset (a deploy refuses until it "
                   "is set); what could start the training, best first (each is a comment in orch.toml):")
        for command in found.candidates:
            render.out(f"  {command}")
    elif found.command is None:
        render.out("no entry point found: set [project] command in orch.toml (a deploy refuses until it is set)")
    else:
        render.out(f"runs {found.entry}")
    if found.requirements:
        render.out(f"found {found.requirements[0]}: the [env] lines in orch.toml build the run's environment "
                   "(uncomment them)")
    for path, rule in found.left_out:
        render.out(f"not sent: {path} ({rule}); add the line !{path} to .orchignore to send it")


def register(app: typer.Typer) -> None:
    app.command()(init)
