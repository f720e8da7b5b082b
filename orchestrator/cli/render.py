"""Output helpers: messages to stderr, results to stdout, ``--json`` prints only JSON."""

from __future__ import annotations

import datetime as _dt
import json
import sys
from typing import Any

import typer


def say(message: str) -> None:
    typer.echo(message, err=True)


def out(message: str = "") -> None:
    typer.echo(message)


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


def which(run: dict) -> str:
    """``experiment 51``, or whose it is when another clone of the project (sharing the target) started it."""
    if run.get("mine", True):
        return f"experiment {run['id']}"
    clone = run.get("clone") or {}
    where = f" ({clone.get('host', '?')}, {clone.get('path', '?')})" if clone else ""
    return f"experiment {run['id']} of another clone of this project{where}"


def exit_code(code: object, word: str = "exit code") -> str:
    """``exit code 1``; ``no exit code`` when none was recorded (a run killed with its supervisor, or lost)."""
    return f"{word} {code}" if code is not None else "no exit code"


def when(ts: float | None) -> str:
    if not ts:
        return "-"
    return _dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def ago(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f}s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"


def size(n: float | None) -> str:
    from ..watch.metrics import format_size

    return format_size(n)


def table(title: str | None, columns: list[str], rows: list[list[Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title, show_lines=False)
    for c in columns:
        t.add_column(c)
    for r in rows:
        t.add_row(*["-" if v is None else str(v) for v in r])
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    console.print(t)


def confirm(question: str) -> bool:
    return typer.confirm(question, default=False, err=True)


def interactive() -> bool:
    return sys.stdin.isatty()


def confirm_or_refuse(yes: bool, question: str, left: str = "nothing was changed") -> None:
    """Go on with ``--yes`` or a "y" at the prompt; off a terminal without ``--yes``, refuse with a hint; a "no"
    says ``left`` (what was left as it was) and what to type instead."""
    from ..errors import InputError, cancelled

    if yes:
        return
    if not interactive():
        raise InputError("refusing without confirmation", hint="rerun with --yes, or in a terminal to be asked")
    if not confirm(question):
        raise cancelled(left, "rerun with --yes to go on without being asked")


def plan_lines(actions, stop_ids: list | None = None) -> list[str]:
    """One numbered line per action of a plan (``launch.model``): what ``--dry-run`` prints; ``stop_ids``: the
    experiments its stop step is kept to (None: every run of the project)."""
    import shlex

    from ..records.experiments import command_line
    from ..launch import model

    lines = []
    for i, a in enumerate(actions, 1):
        if isinstance(a, model.Preflight):
            text = f"check python3 >= 3.10, tmux and {a.min_free_mb} MB free under {a.root}"
        elif isinstance(a, model.Doctor):
            text = ("check the GPU driver and devices, /dev/shm, space and the clock (orch doctor without torch); "
                    "a failed check stops here")
        elif isinstance(a, model.PushRevision):
            text = f"push revision {a.revision} ({a.files} files, {a.size} bytes; only missing ones)"
        elif isinstance(a, model.BuildEnv):
            python = f"python {a.python}" if a.python else "the target's python"
            how = {"push": "wheels resolved here and pushed, installed with no index",
                   "index": "installed from the package index",
                   "auto": "from the index, or pushed wheels if the target cannot reach it"}[a.wheels]
            text = (f"build the environment of {a.source} ({a.requirements} requirements, {python}; {how}) "
                    "unless the target has it" + (" on every node" if a.nodes > 1 else ""))
        elif isinstance(a, model.StopRun):
            text = ("stop this project's running experiments on the target, all of them when several run side by side "
                    "(SIGINT, then SIGTERM, then SIGKILL)" if stop_ids is None else
                    "stop " + ", ".join(f"experiment {i}" for i in stop_ids) + " on the target, and no other run "
                    "(SIGINT, then SIGTERM, then SIGKILL)")
        elif isinstance(a, model.Checkpoints):
            text = {"keep": f"keep the checkpoints in {a.path}",
                    "move": f"move the contents of {a.path} to its trash (restorable)",
                    "purge": f"DELETE the contents of {a.path} (move to trash, then purge)"}[a.action]
        elif isinstance(a, model.Record):
            parent = f", parent {a.parent}" if a.parent else ""
            text = f"record a new experiment (target {a.target}{parent})"
        elif isinstance(a, model.QueueRun):
            shown = command_line(a.command if isinstance(a.command, str) else list(a.command))
            batch = f" (batching: {a.strategy})" if a.strategy else ""
            text = f"queue `{shown}` on the target{batch}: it starts when the experiment " \
                   "before it ends, or now if none runs"
        elif isinstance(a, model.StartRun):
            shown = command_line(a.command if isinstance(a.command, str) else list(a.command))
            how = f" as {shlex.join(a.argv)}" if isinstance(a.command, str) else ""
            batch = f" (batching: {a.strategy})" if a.strategy else ""  # a project with no [batching]: none
            text = f"start `{shown}`{how} in tmux{batch}" + \
                (" on every node, node 0 first" if a.nodes > 1 else "")
        elif isinstance(a, model.VerifyStarted):
            text = f"check the run is alive after {a.wait:g} s" if a.wait else "check the command was spawned"
        elif isinstance(a, model.Shell):
            where = {"root": "the root folder", "revision": "the revision folder",
                     "work": "the run's work folder"}[a.cwd]
            text = f"run {shlex.join(a.argv)} in {where}" + (" on every node" if a.nodes > 1 else "") + \
                ("" if a.check else " (may fail)")
        else:
            text = a.kind
        lines.append(f"{i}. {a.label}: {text}")
    return lines
