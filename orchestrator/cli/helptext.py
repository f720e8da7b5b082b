"""How ``--help`` reads: the commands in named groups, and values named by words (``<N>``, ``<PATH>``), not types.

typer names an option's value by its Python type (``<list[int]>``, ``<float range>``) and shows an id's range up
to SQLite's largest integer; a user wants to know what to type. ``OrchCommand`` names every value once it is
built, whichever way it was built (the lazy table or typer's own).
"""

from __future__ import annotations

import re
from typing import Any

from typer.core import TyperCommand, TyperGroup

# the root's --help, group by group; a command in none of them is listed under "Other commands"
GROUPS: dict[str, tuple[str, ...]] = {
    "Start a project": ("init", "doctor"),
    "Run": ("deploy", "restart", "stop", "play", "exec"),
    "Watch": ("status", "logs", "attach", "ui", "ssh", "forward", "notify"),
    "Results": ("experiments", "pull", "checkpoints"),
    "Targets and GPUs": ("targets", "use", "gpus", "env", "connections"),
    "Queue and sweeps": ("queue", "sweep", "batching"),
    "Maintenance": ("gc",),
}
OTHER = "Other commands"

# what an option's value is, by the option's name; else by its type (TYPE_WORDS)
WORDS = {
    "--target": "NAME", "--pool": "NAME", "--name": "NAME", "--metric": "NAME", "--field": "NAME",
    "--ct": "ID", "--experiment": "ID", "--sweep": "ID",
    "--set": "KEY=VALUE", "--message": "TEXT",
    "--wait": "SECONDS", "--minutes": "MINUTES",
    "--token-budget": "TOKENS", "--max-seq-len": "TOKENS",
    "--registry": "URI",
}
TYPE_WORDS = {"int": "N", "float": "NUMBER", "text": "TEXT", "str": "TEXT", "path": "PATH", "file": "PATH"}
_UPPER_RANGE = re.compile(r"(-?\d+)<=x<=\d{10,}")  # an upper bound nobody types (SQLite's largest integer)


def group_of(name: str) -> str:
    return next((group for group, names in GROUPS.items() if name in names), OTHER)


def grouped(names: list[str]) -> list[tuple[str, list[str]]]:
    """``names`` under their groups, in ``GROUPS``' order (each group keeps the names' order)."""
    order = [*GROUPS, OTHER]
    sections: dict[str, list[str]] = {group: [] for group in order}
    for name in names:
        sections[group_of(name)].append(name)
    return [(group, members) for group, members in sections.items() if members]


def word(param: Any) -> str:
    """The word for an option's value: ``--gpus`` -> ``N``, ``--config`` -> ``PATH``."""
    for opt in getattr(param, "opts", ()):
        if opt in WORDS:
            return WORDS[opt]
    kind = _kind(param)
    for key, value in TYPE_WORDS.items():
        if key in kind:
            return value
    return "VALUE"


def _kind(param: Any) -> str:
    """The value's type in a word: ``int``, ``path``, ``choice`` (typer's own descriptor, else click's type)."""
    desc = getattr(param, "type_descriptor", None)
    if desc is not None:
        return "choice" if desc.is_choice else "path" if desc.is_path else param.bare_type().lower()
    return (getattr(getattr(param, "type", None), "name", "") or "").lower()


def name_values(params: list[Any]) -> None:
    """Give each option that takes a value a word for it, and each argument an upper-case name."""
    for param in params:
        if getattr(param, "param_type_name", "") == "argument":
            if param.metavar is None:
                param.metavar = param.name.upper()
        elif param.metavar is None and not getattr(param, "is_flag", False) and not getattr(param, "count", False):
            if _kind(param) == "choice":
                continue  # its choices are the words
            param.metavar = f"<{word(param)}>"


def help_rows(command: Any, ctx: Any) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(arguments, options) as ``--help`` lists them: an argument by its name alone, no range beyond reason."""
    args, opts = [], []
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None:
            continue
        label, text = record
        text = _UPPER_RANGE.sub(r"x>=\1", text).replace("\\[", "[")  # older typers escape it for rich
        if param.param_type_name == "argument":
            args.append((param.metavar or param.name.upper(), text))
        else:
            opts.append((label, text))
    return args, opts


def write_options(command: Any, ctx: Any, formatter: Any) -> None:
    args, opts = help_rows(command, ctx)
    if args:
        with formatter.section("Arguments"):
            formatter.write_dl(args)
    if opts:
        with formatter.section("Options"):
            formatter.write_dl(opts)


class OrchCommand(TyperCommand):
    """A typer command whose help names values by words."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        name_values(self.params)

    def format_options(self, ctx, formatter) -> None:  # type: ignore[override]
        write_options(self, ctx, formatter)


class OrchSubGroup(TyperGroup):
    """A command group (``orch experiments``) whose own options' help names values by words."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        name_values(self.params)

    def format_options(self, ctx, formatter) -> None:  # type: ignore[override]
        write_options(self, ctx, formatter)
        self.format_commands(ctx, formatter)
