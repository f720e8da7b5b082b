"""mkdocs hooks: the pages that are written from the code at build time, so that they cannot go stale.

    reference/config.md        every orch.toml key, from the pydantic models of ``orchestrator/config.py``
    reference/commands.md      every command and option, from the CLI's click command tree
    internals/architecture.md  ``ARCHITECTURE.md`` at the top of the repository, as it is

``config_reference()`` and ``commands_reference()`` are plain functions (Markdown in, nothing written), so a test
can call them too. The walk is generic: a new section, key, command, option or help panel appears by itself.
"""

from __future__ import annotations

import ast
import html
import inspect
import io
import json
import sys
import textwrap
import tokenize
import types
import typing
from pathlib import Path
from typing import Any, Iterator

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # `mkdocs build` from a checkout whose orch is not installed
    sys.path.insert(0, str(REPO))

GENERATED = {
    "reference/config.md": lambda: config_reference(),
    "reference/commands.md": lambda: commands_reference(),
    "internals/architecture.md": lambda: (REPO / "ARCHITECTURE.md").read_text(encoding="utf-8"),
}

# where each orch.toml section is explained for a reader (the reference says what each key is)
SECTION_PAGES = {
    "project": ("Configuration", "configuration.md"), "paths": ("Configuration", "configuration.md"),
    "batching": ("Batching", "batching.md"), "targets": ("Targets and Proxmox", "targets.md"),
    "proxmox": ("Targets and Proxmox", "targets.md#proxmox-containers-by-ct-id"),
    "ssh": ("SSH settings", "targets.md#ssh-settings"),
    "run": ("Runs that recover", "checkpoints.md#runs-that-recover"),
    "guard": ("Guarded deploys", "guarded-deploys.md"), "trash": ("Checkpoints", "checkpoints.md"),
    "checkpoints": ("Checkpoints", "checkpoints.md"), "metrics": ("Metrics and logs", "metrics.md"),
    "distributed": ("Several nodes", "multi-node.md"), "notify": ("Notifications", "results.md#notifications"),
    "pools": ("Placement", "gpus.md#placement"), "env": ("Python environments", "environments.md"),
    "mlflow": ("MLflow", "results.md#mlflow"),
}


# what a key means where its definition in config.py carries no description or comment; a key listed here that
# config.py no longer has fails the docs test, and so does a key that has a meaning nowhere
MEANINGS = {
    "default_target": "the target a fresh clone acts on; after a deploy with --target/--ct, that one is current",
    "project.name": "the project's name: its tmux session, run folders and checkpoint folder ({project})",
    "project.sources": "files and folders (relative to orch.toml) that make up a revision; a named path is always "
                       "sent, .gitignore and .orchignore apply inside folders",
    "project.command": "what a run runs, in its work folder: a shell line ($VARS, &&) or a list (no shell)",
    "project.env": "environment variables of the run, recorded with every experiment (never credentials)",
    "project.total_steps": "the run's total steps, for the ETA, when its log does not say",
    "paths.root": "orch's own area on a target: agent, blobs, revisions, runs, envs",
    "targets.NAME.kind": "local (this machine), ssh (any SSH host), proxmox (a CT by id) or group (a job's nodes)",
    "targets.NAME.root": "this target's orch root (else [paths] root)",
    "targets.NAME.checkpoints": "this target's checkpoint folder (else [paths] checkpoints)",
    "targets.NAME.python": "the interpreter that runs orch's agent on the target (Python 3.10 or newer)",
    "targets.NAME.host": "kind = ssh: the host, as ~/.ssh/config names it",
    "targets.NAME.port": "the SSH port (else the SSH config's, else 22)",
    "targets.NAME.user": "the SSH user (else the SSH config's)",
    "targets.NAME.identity_file": "the SSH key for this target (else [ssh] identity_file)",
    "targets.NAME.ct": "kind = proxmox: the CT id",
    "targets.NAME.access": "ssh: straight into the container; pct: through its node's pct exec (no sshd in the CT)",
    "targets.NAME.address": "the CT's address, when the one Proxmox reports is not the one to use",
    "proxmox.host": "the Proxmox VE API's host",
    "proxmox.port": "the API's port",
    "proxmox.token_id": "the API token's id, USER@REALM!TOKENID; its secret: ORCH_PROXMOX_TOKEN or token_file",
    "proxmox.token_file": "a file (mode 0600) holding the token's secret",
    "proxmox.verify_ssl": "true, false, or a CA bundle / the node's certificate",
    "proxmox.timeout": "seconds an API request may take",
    "proxmox.start_timeout": "seconds to wait for a CT that --start started",
    "proxmox.node_ssh.user": "access = pct: the user orch logs in as on the node (it runs pct)",
    "proxmox.node_ssh.host": "the node's address, when its name from /cluster/resources does not resolve",
    "proxmox.node_ssh.port": "the node's sshd port (else the SSH config's, else 22)",
    "ssh.config_file": "the SSH config read for HostName, Port, User, IdentityFile, ConnectTimeout, ProxyJump, "
                       "ProxyCommand (default ~/.ssh/config)",
    "ssh.known_hosts": "known_hosts files checked (default ~/.ssh/known_hosts and ~/.config/orch/known_hosts)",
    "ssh.trust_file": "where --trust-new-host records a key (default ~/.config/orch/known_hosts)",
    "ssh.identity_file": "the key to log in with (else the agent, the SSH config, ~/.ssh/id_*)",
    "ssh.command_timeout": "seconds a command may go without progress (a push: without a byte moving)",
    "ssh.keepalive": "seconds between keepalive probes; 4 missed ones: the connection is lost",
    "ssh.connect_retries": "retries of connecting only (a command that may have run is never run again)",
    "run.restart_on": "failure: restart a run that failed; always: also one that exited 0",
    "run.resume_after_reboot": "a container restart resumes the run from its newest checkpoint (a systemd unit)",
    "guard.on_fail": "rollback: put the parent back; stop: stop the new run and leave the parent stopped",
    "metrics.patterns": "metric name = a regex with one group (the number), tried on every log line",
    "distributed.port": "the rendezvous port on node 0",
    "notify.format": "the webhook's body: slack, discord, ntfy or json",
    "notify.on": "the events sent: crashed, stalled, restarted, finished, spike, slow",
    "pools.NAME.members": "target names or CT ids that deploy --pool NAME --gpus N chooses among",
    "env.build_timeout": "seconds an environment build may take",
}


def on_files(files, config):  # noqa: ANN001 (mkdocs' hook signature)
    from mkdocs.structure.files import File

    for uri, make in GENERATED.items():
        if files.get_file_from_path(uri) is None:
            files.append(File.generated(config, uri, content=make()))
    return files


# ---------------------------------------------------------------------------------------------------------- config

def _cell(text: str) -> str:
    """Text for one cell of a Markdown table: HTML-escaped, its pipes kept from splitting the row."""
    text = html.escape(" ".join(str(text).split()))
    for char in "|_*`[]\\":  # as entities: Markdown reads none of them as markup (``__main__`` is not bold)
        text = text.replace(char, f"&#{ord(char)};")
    return text


def _code(text: str) -> str:
    return f"<code>{_cell(text)}</code>"


def _model(annotation: Any) -> type | None:
    """The pydantic model an annotation holds (``Section``, ``Section | None``), else None."""
    from pydantic import BaseModel

    for arg in (annotation, *typing.get_args(annotation)):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def _type_name(annotation: Any) -> str:
    """An annotation as a reader of orch.toml sees it: ``number``, ``"a" | "b"``, ``list of text``."""
    if annotation is type(None):
        return "none"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args if a is not type(None))
    if origin is list:
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return f"table of {_type_name(args[1])}" if len(args) == 2 else "table"
    return {str: "text", int: "integer", float: "number", bool: "true | false"}.get(annotation,
                                                                                  getattr(annotation, "__name__",
                                                                                          str(annotation)))


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}" if value else "{}"
    return str(value)


def _default(field: Any) -> str:
    from pydantic_core import PydanticUndefined

    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return "unset"
    if hasattr(value, "model_dump"):
        return "(a table)"
    return _toml(value)


def _source_comments(cls: type) -> dict[str, str]:
    """Each field's comment in the class's source: the one after it on its line(s), else the lines just above."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # made at run time (create_model): its fields carry descriptions
        return {}
    comments: dict[int, str] = {}
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            code_lines.add(tok.start[0])
    found: dict[str, str] = {}
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    for node in body.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        end = node.end_lineno or node.lineno
        after = [comments[n] for n in range(node.lineno, end + 1) if n in comments]
        above: list[str] = []
        line = node.lineno - 1
        while line in comments and line not in code_lines:
            above.insert(0, comments[line])
            line -= 1
        text = " ".join(after) or " ".join(above)
        if text and "noqa" not in text:
            found[node.target.id] = text
    return found


def _keys(model: type, prefix: str) -> Iterator[tuple[str, Any, str]]:
    """(dotted key, field, meaning) of every key of a section, a nested table's keys (``proxmox.node_ssh.user``)
    included."""
    notes = _source_comments(model)
    for name, field in model.model_fields.items():
        inner = _model(field.annotation)
        if inner is not None and typing.get_origin(field.annotation) is not dict:
            yield from _keys(inner, f"{prefix}{name}.")
            continue
        key = f"{prefix}{name}"
        yield key, field, field.description or notes.get(name, "") or MEANINGS.get(key, "")


def _doc(cls: type) -> str:
    doc = cls.__dict__.get("__doc__")  # its own, not one inherited from BaseModel
    return inspect.cleandoc(doc) if doc else ""


def _table(rows: list[tuple[str, Any, str]]) -> list[str]:
    out = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    for key, field, meaning in rows:
        out.append(f"| {_code(key)} | {_cell(_type_name(field.annotation))} | {_code(_default(field))} | "
                   f"{_cell(meaning)} |")
    return out


def _precedence(doc: str) -> str:
    """The indented block of ``config``'s docstring: the one precedence line."""
    block = [line.strip() for line in inspect.cleandoc(doc).splitlines() if line.startswith("    ")]
    return "\n".join(block) or inspect.cleandoc(doc).splitlines()[0]


def config_reference() -> str:
    """Markdown: every key of orch.toml, section by section, from ``orchestrator.config.Settings``."""
    from orchestrator import config

    lines = ["# orch.toml reference", "",
             "Generated from the settings' own definitions (`orchestrator/config.py`) each time the site is "
             "built: every key orch reads, its type, its default and what it means. How the settings are "
             "found and merged is in [Configuration](../configuration.md).", "",
             "Precedence, lowest first: " + html.escape(" ".join(_precedence(config.__doc__ or "").split())) + ".", "",
             "A key is written `section.key` on the command line (`--set run.stop_timeout=60`) and "
             "`ORCH_SECTION__KEY` in the environment (`ORCH_RUN__STOP_TIMEOUT=60`).", ""]
    top: list[tuple[str, Any, str]] = []
    sections: list[tuple[str, type, bool]] = []
    for name, field in config.Settings.model_fields.items():
        model = _model(field.annotation)
        if model is None:
            top.append((name, field, field.description or _source_comments(config.Settings).get(name, "")
                        or MEANINGS.get(name, "")))
        else:
            sections.append((name, model, typing.get_origin(field.annotation) is dict))
    lines += ["## Top level", "", *_table(top), ""]
    for name, model, named in sections:
        heading = f"[{name}.NAME]" if named else f"[{name}]"
        lines += [f"## `{heading}`", ""]
        doc = _doc(model)
        if doc:
            lines += [doc.replace("``", "`"), ""]
        if name in SECTION_PAGES:
            title, page = SECTION_PAGES[name]
            lines += [f"Explained in [{title}](../{page}).", ""]
        lines += [*_table(list(_keys(model, f"{name}.NAME." if named else f"{name}."))), ""]
    if config.RENAMED:
        lines += ["## Renamed keys", "",
                  "An old name is still read, with one warning naming the new one; an old and a new name given "
                  "in the same place with different values are an error.", "",
                  "| old key | now |", "| --- | --- |"]
        lines += [f"| {_code(old)} | {_code(new)}{_cell(note)} |" for old, (new, note) in config.RENAMED.items()]
        lines.append("")
    return "\n".join(lines)


def config_meanings() -> dict[str, str]:
    """Every dotted key the reference lists, with the meaning it shows (for the docs test)."""
    from orchestrator import config

    found = {}
    for name, field in config.Settings.model_fields.items():
        model = _model(field.annotation)
        if model is None:
            found[name] = field.description or MEANINGS.get(name, "")
        else:
            named = typing.get_origin(field.annotation) is dict
            found.update({k: m for k, _f, m in _keys(model, f"{name}.NAME." if named else f"{name}.")})
    return found


# -------------------------------------------------------------------------------------------------------- commands

def _walk(command: Any, ctx: Any) -> Iterator[tuple[Any, Any]]:
    """(command, its context) for ``command`` and every sub-command under it, in the CLI's own order."""
    from orchestrator.cli.main import click_core

    yield command, ctx
    if hasattr(command, "list_commands"):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is None or getattr(sub, "hidden", False):
                continue
            yield from _walk(sub, click_core.Context(sub, info_name=name, parent=ctx))


def _help_text(text: str | None) -> str:
    """A command's help as Markdown paragraphs (click's ``\\b`` no-rewrap marker kept as a line block)."""
    if not text:
        return ""
    out = []
    for para in inspect.cleandoc(text).split("\n\n"):
        if para.startswith("\b"):
            out.append("```text\n" + para[1:].strip("\n") + "\n```")
        else:
            out.append(f"<p>{_cell(para)}</p>")
    return "\n\n".join(out)


def _params(command: Any, ctx: Any) -> list[str]:
    """The command's arguments and options as tables, one per help panel where the CLI groups them."""
    panels: dict[str, list[str]] = {}
    for param in command.get_params(ctx):
        if getattr(param, "hidden", False):
            continue
        record = param.get_help_record(ctx) if hasattr(param, "get_help_record") else None
        if param.param_type_name == "argument":
            names = param.make_metavar(ctx) if record is None else record[0]
            meaning = record[1] if record else (getattr(param, "help", None) or "")
            panel = getattr(param, "rich_help_panel", None) or "Arguments"
        else:
            if record is None:
                continue
            names, meaning = record
            panel = getattr(param, "rich_help_panel", None) or "Options"
        panels.setdefault(panel, []).append(f"| {_code(names)} | {_cell(meaning)} |")
    out: list[str] = []
    for panel, rows in panels.items():
        first = "argument" if panel == "Arguments" else "option"
        out += [f"**{html.escape(panel)}**", "", f"| {first} | meaning |", "| --- | --- |", *rows, ""]
    return out


def _sections(command: Any, ctx: Any) -> list[tuple[str, list[str]]]:
    """The sections a group's ``--help`` lists its commands under (``Run: deploy, restart``), read from the
    group's own ``format_commands`` through click's formatter, so any grouping the CLI draws is followed."""
    from orchestrator.cli.main import click_core

    found: list[tuple[str, list[str]]] = []

    class Recorder(click_core.HelpFormatter):
        def section(self, name):  # type: ignore[override]
            found.append((name, []))
            return super().section(name)

        def write_dl(self, rows, *args, **kwargs):  # type: ignore[override]
            rows = list(rows)
            if found:
                found[-1][1].extend(first.split()[0] for first, _ in rows if first.strip())
            return super().write_dl(rows, *args, **kwargs)

    command.format_commands(ctx, Recorder())
    return [(name, names) for name, names in found if names]


def commands_reference() -> str:
    """Markdown: every command of ``orch``, with its help, usage and options, from the click command tree, under
    the sections ``orch --help`` groups them in."""
    from orchestrator.cli.main import click_core, root_command

    root = root_command()
    top = click_core.Context(root, info_name="orch", **root.context_settings)
    lines = ["# Command reference", "",
             "Generated from the CLI itself each time the site is built: every command, as `orch COMMAND "
             "--help` shows it. Exit codes and the `error:`/`hint:` lines are described in "
             "[Commands](../commands.md).", ""]
    lines += _command(root, top, 1)
    order = {name: i for i, name in enumerate(root.list_commands(top))}
    sections = _sections(root, top)
    listed = {name for _, names in sections for name in names}
    rest = [name for name in order if name not in listed]
    if rest:
        sections.append(("Other commands" if sections else "Commands", rest))
    for title, names in sections:
        lines += [f"## {html.escape(title)}", ""]
        for name in names:
            sub = root.get_command(top, name)
            if sub is None or getattr(sub, "hidden", False):
                continue
            for command, ctx in _walk(sub, click_core.Context(sub, info_name=name, parent=top)):
                lines += _command(command, ctx, len(ctx.command_path.split()) + 1)
    return "\n".join(lines)


def _command(command: Any, ctx: Any, level: int) -> list[str]:
    """One command's heading, help, usage and options."""
    path = ctx.command_path
    lines = [f"{'#' * min(level, 5)} `{path}`" if ctx.parent else "## Global options", ""]
    if ctx.parent:
        lines += [_help_text(command.help or command.short_help), ""]
    usage = " ".join([path, *command.collect_usage_pieces(ctx)])
    return lines + ["```text", usage, "```", "", *_params(command, ctx)]


def command_paths() -> list[str]:
    """Every command's full name (``orch experiments compare``), for the test that checks the reference."""
    from orchestrator.cli.main import click_core, root_command

    root = root_command()
    top = click_core.Context(root, info_name="orch", **root.context_settings)
    return [ctx.command_path for _c, ctx in _walk(root, top)]
