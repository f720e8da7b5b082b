"""Every command, walked: a module-level function with a docstring, whose ``--help`` loads through the real
``orch`` entry point (the lazy command table users get) and the same as typer builds it."""

from __future__ import annotations

import inspect
import os
import re
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
    sections = _sections(proc.stdout)
    listed = {line.split()[0] for lines in sections.values() for line in lines}
    assert listed == {p[0] for p, _ in COMMANDS}
    assert sections["Run"][0].split()[0] == "deploy"
    assert len(sections) >= 4 and "init" in sections["Start a project"][0]
    for path, callback in COMMANDS:
        if len(path) == 1:
            summary = inspect.getdoc(callback).split("\n")[0]
            assert f"{path[0]} " in proc.stdout and summary[:30] in proc.stdout, path


def _sections(text: str) -> dict[str, list[str]]:
    """The command groups of ``orch --help``: each heading after Options, with its command lines."""
    sections: dict[str, list[str]] = {}
    heading = None
    for line in text.split("\nOptions:\n", 1)[1].splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            heading = line[:-1]
            sections[heading] = []
        elif heading and line.startswith("  ") and not line.startswith("   "):
            sections[heading].append(line.strip())
    return sections


TYPE_WORDS = re.compile(r"<(?:list\[|int|float|str|bool|path|datetime)|\brange>|\d{10,}")


@pytest.mark.parametrize("path", [(), *[p for p, _ in COMMANDS], *{p[:1] for p, _ in COMMANDS if len(p) > 1}],
                         ids=lambda p: " ".join(p) or "orch")
def test_each_help_names_values_by_words_not_types(path, capsys):
    shown = _lazy_help(list(path), capsys)
    assert not TYPE_WORDS.search(shown), shown
    for line in shown.splitlines():  # every option that takes a value says what in upper-case words
        if line.lstrip().startswith("-") and "<" in line.split("  ")[0]:
            value = line.split("  ")[0].rsplit("<", 1)[1]
            assert value.rstrip(">").replace("=", "").isupper(), line


def test_a_value_is_named_for_what_to_type():
    from orchestrator.cli.helptext import GROUPS

    assert "ui" in GROUPS["Watch"]  # a command still to come has a group to land in
    env = dict(os.environ, ORCH_WARM="0", COLUMNS="200")
    orch = os.path.join(os.path.dirname(sys.executable), "orch")
    deploy = subprocess.run([orch, "deploy", "--help"], capture_output=True, text=True, env=env, timeout=60).stdout
    for shown in ("--ct <ID>", "--gpus <N>", "--set <KEY=VALUE>", "--wait <SECONDS>", "--target <NAME>"):
        assert shown in deploy, shown
    show = subprocess.run([orch, "experiments", "show", "--help"], capture_output=True, text=True, env=env,
                          timeout=60).stdout
    assert "ID  [x>=1; required]" in show


def test_python_dash_m_orchestrator_is_orch(tmp_path):
    env = dict(os.environ, ORCH_WARM="0")
    shown = subprocess.run([sys.executable, "-m", "orchestrator", "--help"], capture_output=True, text=True,
                           env=env, timeout=60, cwd=tmp_path)
    assert shown.returncode == 0 and shown.stdout.startswith("Usage: orch [OPTIONS] COMMAND")
    wrong = subprocess.run([sys.executable, "-m", "orchestrator", "compare"], capture_output=True, text=True,
                           env=env, timeout=60, cwd=tmp_path)
    assert wrong.returncode == 2 and "experiments compare" in wrong.stderr
