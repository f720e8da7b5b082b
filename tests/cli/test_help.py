"""Every command, walked: a module-level function with a docstring, whose ``--help`` loads through the real
``orch`` entry point (the lazy command table users get) and the same as typer builds it."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import pytest
import typer

from orchestrator.cli.main import app, lazy_command


def _commands(typer_app: typer.Typer, path: tuple[str, ...] = ()):
    """(command path, callback) for every command; groups are walked into."""
    tm = typer.main
    for info in typer_app.registered_commands:
        yield path + (info.name or tm.get_command_name(info.callback.__name__),), info.callback
    for group in typer_app.registered_groups:
        yield from _commands(group.typer_instance, path + (tm.solve_typer_info_defaults(group).name,))


COMMANDS = list(_commands(app))
PATHS = [" ".join(p) for p, _ in COMMANDS]


def test_the_walk_sees_every_command():
    assert len(COMMANDS) >= 26
    for expected in ("deploy", "status", "logs", "exec", "gc", "use", "init", "experiments show",
                     "checkpoints restore", "batching plan", "connections close"):
        assert expected in PATHS


@pytest.mark.parametrize("path, callback", COMMANDS, ids=PATHS)
def test_each_command_is_a_module_level_function_with_a_docstring(path, callback):
    assert "<locals>" not in callback.__qualname__, f"orch {' '.join(path)} is a closure: {callback.__qualname__}"
    module = sys.modules[callback.__module__]
    assert getattr(module, callback.__name__) is callback, f"{callback.__module__}.{callback.__name__}"
    assert (inspect.getdoc(callback) or "").strip(), f"orch {' '.join(path)} has no docstring"


def test_status_and_logs_live_in_modules_of_their_own():
    where = {" ".join(p): cb.__module__ for p, cb in COMMANDS}
    assert where["status"] == "orchestrator.cli.status"
    assert where["logs"] == "orchestrator.cli.logs"


def _lazy_help(args: list[str], capsys) -> str:
    """``orch ARGS --help`` through the lazy command table, as the ``orch`` entry point builds it."""
    with pytest.raises(SystemExit) as shown:
        lazy_command(app).main([*args, "--help"], prog_name="orch")
    out = capsys.readouterr()
    assert shown.value.code == 0, (args, out.err)
    return out.out


@pytest.mark.parametrize("path, callback", COMMANDS, ids=PATHS)
def test_each_help_loads_and_matches_typers_own(path, callback, capsys):
    from typer.testing import CliRunner

    shown = _lazy_help(list(path), capsys)
    assert shown.startswith(f"Usage: orch {' '.join(path)} "), shown
    assert " ".join(inspect.getdoc(callback).split())[:40] in " ".join(shown.split())
    built = CliRunner().invoke(app, [*path, "--help"], prog_name="orch")  # typer's whole table, built at once
    assert built.exit_code == 0
    assert built.output.split() == shown.split()  # the same words (each runner wraps at its own width)


def test_orch_help_lists_every_command_with_its_summary():
    env = dict(os.environ, ORCH_WARM="0", COLUMNS="200")
    orch = os.path.join(os.path.dirname(sys.executable), "orch")  # the installed entry point
    proc = subprocess.run([orch, "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    listed = {line.split()[0] for line in proc.stdout.split("Commands:")[1].splitlines() if line.strip()}
    assert listed == {p[0] for p, _ in COMMANDS}
    for path, callback in COMMANDS:
        if len(path) == 1:
            summary = inspect.getdoc(callback).split("\n")[0]
            assert f"{path[0]} " in proc.stdout and summary[:30] in proc.stdout, path
