"""One error format: ``error:``/``hint:`` lines, the exit codes the docs give, and hints that point somewhere real.

The hint walk reads every hint in ``orchestrator/`` (``hint=`` arguments, the hint argument of an error class or
``AgentFailure``, ``"hint"`` dict values, ``hint = ...`` assignments, ``"hint: ..."`` lines) and checks that each
``[section] key`` it names is a setting of the config schema, and each ``--flag`` an option of the command it names
(``orch deploy --start``), or of some command when it names none.
"""

from __future__ import annotations

import ast
import re
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from orchestrator import errors
from orchestrator.config import Settings

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "orchestrator"
SETTING = re.compile(r"\[([a-z_]+)\] ([a-z_][a-z_.]*[a-z_])")
NOT_KEYS = {"section", "sections", "in", "of", "for", "defaults", "lines", "table", "and", "or"}
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z-]*[a-z]")
COMMAND = re.compile(r"\borch((?: [a-z][a-z-]*)+)")


def _texts(node: ast.AST) -> list[str]:
    """The literal text of a string expression; formatted parts become ``{}``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return ["".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return [a + b for a in _texts(node.left) or ["{}"] for b in _texts(node.right) or ["{}"]]
    if isinstance(node, ast.IfExp):
        return _texts(node.body) + _texts(node.orelse)
    return []


def _name(func: ast.AST) -> str:
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def hints() -> list[tuple[str, str]]:
    """(where, text) of every hint in the package."""
    found = []
    for path in sorted(PKG.rglob("*.py")):
        where = path.relative_to(REPO).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            exprs: list[ast.AST] = []
            if isinstance(node, ast.Call):
                name = _name(node.func)
                exprs += [k.value for k in node.keywords if k.arg == "hint"]
                if name.endswith("Error") and len(node.args) >= 2:
                    exprs.append(node.args[1])
                elif name == "AgentFailure" and len(node.args) >= 3:
                    exprs.append(node.args[2])
                elif name == "fail" and len(node.args) >= 2:
                    exprs.append(node.args[1])
            elif isinstance(node, ast.Dict):
                exprs += [v for k, v in zip(node.keys, node.values)
                          if isinstance(k, ast.Constant) and k.value == "hint" and v is not None]
            elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "hint"
                                                      for t in node.targets):
                exprs.append(node.value)
            elif isinstance(node, (ast.Constant, ast.JoinedStr)):
                exprs += [node] if any(t.startswith("hint: ") for t in _texts(node)) else []
            found += [(f"{where}:{node.lineno}", text) for e in exprs for text in _texts(e)]
    return found


def _model(annotation: object) -> type[BaseModel] | None:
    """The settings model a field holds (through Optional and dict values), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        if (model := _model(arg)) is not None:
            return model
    return None


def setting_exists(section: str, key: str) -> bool:
    model: type[BaseModel] | None = Settings
    for part in [section, *key.split(".")]:
        if model is None or part not in model.model_fields:
            return False
        model = _model(model.model_fields[part].annotation)
    return True


def _options(command) -> set[str]:
    return {opt for p in command.params for opt in getattr(p, "opts", []) + getattr(p, "secondary_opts", [])
            if opt.startswith("--")}


def command_tree() -> dict[str, set[str]]:
    """Every command path (``""`` is orch itself, ``"checkpoints clean"``) -> its long options."""
    import typer

    from orchestrator.cli.main import app

    root = typer.main.get_command(app)
    tree: dict[str, set[str]] = {}

    def walk(cmd, path: str) -> None:
        tree[path] = _options(cmd) | {"--help"}
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, f"{path} {name}".strip())

    walk(root, "")
    return tree


def _named_command(text: str, tree: dict[str, set[str]], before: int | None = None) -> str | None:
    """The command path the last ``orch ...`` in the text (before position ``before``) names, if any."""
    best = None
    for match in COMMAND.finditer(text[:before]):
        words = match.group(1).split()
        for n in range(len(words), 0, -1):
            if " ".join(words[:n]) in tree:
                best = " ".join(words[:n])
                break
    return best


def _orch_text(text: str) -> str:
    """The text without quoted commands of other programs (`pct set ... --net0`, `pveum ... --roles`)."""
    return re.sub(r"`(?!orch )[^`]*`", "``", text)


def test_the_walk_finds_the_hints():
    found = hints()
    assert len(found) > 80
    assert any("[run] lock_timeout" in text for _, text in found)  # from the agent's lock


def test_every_setting_a_hint_names_exists():
    bad = [f"{where}: [{s}] {k}" for where, text in hints() for s, k in SETTING.findall(text)
           if k not in NOT_KEYS and not setting_exists(s, k)]
    assert not bad, "hints name settings that do not exist:\n" + "\n".join(bad)


def test_every_flag_a_hint_names_exists_on_its_command():
    tree = command_tree()
    every = set().union(*tree.values())
    bad = []
    for where, text in hints():
        text = _orch_text(text)
        for match in FLAG.finditer(text):
            flag, command = match.group(0), _named_command(text, tree, match.start())
            options = tree[command] | tree[""] if command is not None else every
            if flag not in options:
                bad.append(f"{where}: {flag} ({'orch ' + command if command else 'no command'}): {text[:100]}")
    assert not bad, "hints name flags that do not exist there:\n" + "\n".join(bad)


def test_the_walk_would_catch_a_wrong_setting_and_a_wrong_flag():
    assert not setting_exists("transport", "connect_timeout") and setting_exists("ssh", "connect_timeout")
    assert setting_exists("proxmox", "node_ssh.host") and not setting_exists("proxmox", "node_ssh.nope")
    tree = command_tree()
    assert "--start" in tree["deploy"] and "--start" not in tree["stop"]
    assert _named_command("stop it first (orch stop), or use orch checkpoints clean", tree) == "checkpoints clean"
    assert _named_command("orch stop, or orch deploy --start", tree, 26) == "deploy"
    assert _orch_text("see `pct start 200 --debug` or `orch deploy --start`") == "see `` or `orch deploy --start`"


def _readme_exit_codes() -> dict[int, str]:
    text = (REPO / "docs" / "commands.md").read_text()
    table = re.search(r"Exit codes: (.*?)\.", text, re.S)
    assert table, "docs/commands.md has no exit code table"
    return {int(code): words.strip() for code, words in re.findall(r"(\d+) (.*?)(?=,\s+\d+ |$)",
                                                                     " ".join(table.group(1).split()))}


@pytest.mark.parametrize("cls,words", [
    (errors.OrchError, "other"), (errors.InputError, "bad input"), (errors.ConfigError, "config"),
    (errors.TargetError, "unreachable"), (errors.ProxmoxError, "Proxmox"), (errors.TransportError, "SSH"),
    (errors.AgentError, "agent failure"), (errors.ConflictError, "busy"), (errors.SafetyError, "unsafe"),
    (errors.NotFoundError, "not found"), (errors.Interrupted, "interrupted")])
def test_each_error_family_exits_with_the_readme_code(cls, words):
    table = _readme_exit_codes()
    assert words in table[cls.exit_code], f"{cls.__name__} exits {cls.exit_code}: docs/commands.md says {table}"


def test_the_error_tree_drawing_matches_the_codes():
    drawn = dict(re.findall(r"(\w+Error|OrchError|Interrupted|HostKeyError|TransportTimeout)\s+exit (\d+)",
                            errors.__doc__ or ""))
    assert drawn and all(getattr(errors, name).exit_code == int(code) for name, code in drawn.items())


def test_agent_failure_kinds_map_onto_the_tree():
    from orchestrator.agent.protocol import KINDS
    from orchestrator.reach.agent_client import _KIND_TO_ERROR

    assert set(KINDS) <= set(_KIND_TO_ERROR)


@pytest.mark.parametrize("args", [["deploy", "--nope"], ["experiments", "show", "abc"], ["nosuch"],
                                  ["gc", "--keep", "-1"], ["experiments", "show"]])
def test_usage_errors_use_the_same_format(args, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from orchestrator.cli.main import app

    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, args, prog_name="orch")
    lines = res.output.strip().splitlines()
    assert res.exit_code == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: see orch"), res.output
    assert "Error:" not in res.output and "Usage:" not in res.output


def test_an_orch_error_prints_error_and_hint(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from orchestrator.cli.main import app

    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["status"], prog_name="orch")
    assert res.exit_code == 2 and res.output.startswith("error: no orch.toml") and "\nhint: " in res.output


def test_every_node_ssh_key_is_documented():
    from orchestrator.config import NodeSsh

    text = (REPO / "docs" / "targets.md").read_text()
    section = text[text.index("[proxmox] node_ssh`, an inline table"):]
    assert all(f"| `{key}` |" in section for key in NodeSsh.model_fields), list(NodeSsh.model_fields)


@pytest.mark.parametrize("role,setting", [("the Proxmox node pve1", "[proxmox] node_ssh.host"),
                                          (None, "use an IP address")])
def test_an_unresolvable_node_names_the_setting_to_change(role, setting):
    from orchestrator.errors import TransportError
    from orchestrator.reach.transport.ssh import SshTransport

    transport = SshTransport("no-such-node.invalid", role=role, connect_retries=0, trust_file="/nonexistent")
    with pytest.raises(TransportError, match="cannot resolve host name") as info:
        transport.run(["true"])
    assert setting in (info.value.hint or "")


# what pydantic-core raised when a Ctrl-C came while it built a model's schema (seen by interrupting imports)
INTERRUPTED_SCHEMA = ('Error building "function-after" validator:\n  SchemaError: Error building "model" validator:\n'
                      '  SchemaError: Field "overlong":\n  SchemaError: Error building "literal" validator:\n'
                      '  KeyboardInterrupt: ')


@pytest.mark.parametrize("raised", ["schema", "answer", "other"])
def test_a_ctrl_c_wrapped_by_a_library_reads_as_interrupted(raised, tmp_path, monkeypatch):
    import typer
    from pydantic_core import SchemaError
    from typer.testing import CliRunner

    from orchestrator.cli.main import app

    def command(*_a, **_k):
        if raised == "schema":
            raise SchemaError(INTERRUPTED_SCHEMA)
        if raised == "answer":  # a command's own answer to a Ctrl-C (logs --follow: stopped following, exit 0)
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt:
                typer.echo("stopped following", err=True)
                raise typer.Exit(0)
        raise SchemaError('Error building "literal" validator:\n  ValueError: no')

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("orchestrator.cli.common.settings", command)
    res = CliRunner().invoke(app, ["targets"], prog_name="orch")
    if raised == "schema":
        assert res.exit_code == 130 and res.output.strip() == "interrupted", res.output
    elif raised == "answer":
        assert res.exit_code == 0 and res.output.strip() == "stopped following", res.output
    else:  # a real bug still shows as one
        assert res.exit_code == 1 and isinstance(res.exception, SchemaError), res.output
