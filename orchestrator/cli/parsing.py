"""How the root reads a command line before click does: orch's global options after the command too
(``orch deploy --config X``), and a mistyped command pointed at the one meant (``compare`` -> ``experiments
compare``)."""

from __future__ import annotations

from difflib import get_close_matches
from typing import Any

GLOBAL_VALUED = ("--config",)  # global options that take a value
GLOBAL_FLAGS = ("--verbose",)


def _leaf(root: Any, ctx: Any, words: list[str]) -> tuple[Any, int]:
    """The command ``words`` name (walking into groups) and how many words named it; (None, 0) for none."""
    command, used = root, 0
    while used < len(words) and hasattr(command, "commands"):
        sub = command.commands.get(words[used])
        if sub is None:
            break
        command, used = sub, used + 1
    return (command, used) if used else (None, 0)


def _options_of(command: Any, ctx: Any) -> tuple[set[str], set[str]]:
    """(every option string of ``command``, those that take a value)."""
    names, valued = set(), set()
    for param in command.get_params(ctx):
        if getattr(param, "param_type_name", "") != "option":
            continue
        opts = {*param.opts, *param.secondary_opts}
        names |= opts
        if not getattr(param, "is_flag", False) and not getattr(param, "count", False):
            valued |= opts
    return names, valued


def hoisted(root: Any, ctx: Any, args: list[str]) -> list[str]:
    """``args`` with global options that follow the command moved in front of it, unless the command has an
    option of that name itself; nothing after ``--`` moves, nor anything after a command's first free word when
    its options end there (``orch exec CMD --config x`` hands ``--config x`` to CMD)."""
    start = 0
    while start < len(args) and args[start].startswith("-") and args[start] != "--":  # the root's own options
        start += 2 if args[start] in GLOBAL_VALUED else 1
    command, used = _leaf(root, ctx, args[start:])
    if command is None:
        return args
    own, valued = _options_of(command, ctx)
    interspersed = command.context_settings.get("allow_interspersed_args", command.allow_interspersed_args)
    front, rest = [], []
    i = start + used
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest += args[i:]
            break
        name = arg.split("=", 1)[0]
        if name in GLOBAL_VALUED and name not in own:
            front += args[i:i + 1 + ("=" not in arg)]
            i += 1 + ("=" not in arg)
            continue
        if arg in GLOBAL_FLAGS and arg not in own:
            front.append(arg)
            i += 1
            continue
        if not arg.startswith("-") and not interspersed:
            rest += args[i:]  # the command's free words begin: its options end here
            break
        rest.append(arg)
        if arg in valued and i + 1 < len(args):
            rest.append(args[i + 1])
            i += 1
        i += 1
    return args[:start] + front + args[start:start + used] + rest


def suggestions(root: Any, typo: str) -> tuple[list[str], bool]:
    """The commands a mistyped top-level word may mean, and whether they are exact: the groups' sub-commands of
    that name (``restore`` -> ``checkpoints restore``), else the closest ``group sub-command``."""
    nested: dict[str, list[str]] = {}
    for name in list(root.commands):
        for sub in getattr(root.commands[name], "commands", {}) or {}:
            nested.setdefault(sub, []).append(f"{name} {sub}")
    if typo in nested:
        return nested[typo], True
    close = get_close_matches(typo, list(nested), n=1, cutoff=0.8)
    return (nested[close[0]] if close else []), False
