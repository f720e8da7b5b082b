"""Pure: everything the agent would refuse about a launch, checked on the controller before any agent call.

The limits are the agent's own (``agent/serving/validate.py``, ``agent/run/handover.py``), imported rather than copied,
so a launch that can never start is an ``InputError`` naming the key and the limit, and nothing is stopped,
moved or recorded anywhere::

    check(launch)                                  # deploy, restart, play: before the probe
    check_start(argv, env, secrets, "node 1's command")   # a job's node, once torchrun's words are in
"""

from __future__ import annotations

import json
from typing import Mapping

from . import command as commands
from ..agent.run import handover
from ..agent.serving.validate import (ARG_CHARS, ENV_VALUE_CHARS, EXEC_STRING_BYTES, EXEC_TOTAL_BYTES, MAX_ARGS,
                                      MAX_ID, RUN_ENV_ALLOWANCE, exec_size)
from ..errors import InputError

MAX_SECONDS = 1e9  # the agent's bound on every timeout it is given
MAX_FREE_MB = 1 << 30
PROJECT_CHARS = 128
HINT_LONG = ("keep long settings in a file of the revision (a config file) and pass its path, "
             "or run a script from the revision")


def _string(value: object, key: str, limit: int = ARG_CHARS, hint: str = HINT_LONG) -> None:
    if not isinstance(value, str):
        raise InputError(f"{key} must be a string, not {type(value).__name__}")
    if "\0" in value:
        raise InputError(f"{key} contains a NUL character, which no program argument can hold",
                         hint="remove it")
    if len(value) > limit:
        raise InputError(f"{key} is {len(value)} characters long; the target takes at most {limit}", hint=hint)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"{key} is not valid UTF-8", hint="remove the stray characters") from None


def check_start(argv: list[str], env: Mapping[str, str], secrets: Mapping[str, str],
                key: str = "[project] command") -> None:
    """The command and environment one run is started with, as the agent and the kernel's execve take them."""
    if len(argv) > MAX_ARGS:
        raise InputError(f"{key} has {len(argv)} arguments; the target takes at most {MAX_ARGS}", hint=HINT_LONG)
    line = len(argv) == 3 and argv[:2] == [commands.SHELL, "-c"]  # a shell line: its one long word is the line
    for i, word in enumerate(argv):
        _string(word, f"{key} (the line as {commands.SHELL} -c runs it)" if line and i == 2 else f"{key}[{i}]")
    for name, value in env.items():
        if not name or "=" in name or "\0" in name or len(name) > ARG_CHARS:
            raise InputError(f"[project] env name {name[:80]!r} is not an environment variable name",
                             hint="use letters, digits and '_' (no '=')")
        _string(value, f"[project] env {name}", ENV_VALUE_CHARS, hint="keep large values in a file of the revision")
    for name, value in secrets.items():
        if len(name) > ARG_CHARS:
            raise InputError(f"[project] secrets name {name[:80]}… is over {ARG_CHARS} characters",
                             hint="choose a shorter name")
        if "\0" in value:  # the value itself is never said
            raise InputError(f"secret {name} contains a NUL character", hint="fix its value")
    sent = len(json.dumps(dict(secrets)).encode()) + 1
    if secrets and sent > handover.LIMIT:
        raise InputError(f"the secrets are {sent} bytes together; at most {handover.LIMIT} can be handed to a run",
                         hint="keep large credentials in a file on the target and name its path in a secret")
    total, over = exec_size(list(argv), {**env, **secrets})
    if over is not None:
        name = over[4:-1]
        what = key if over.startswith("argv") else f"secret {name}" if name in secrets else f"[project] env {name}"
        raise InputError(f"{what} is over {EXEC_STRING_BYTES} bytes, more than one string the kernel starts "
                         "a program with can hold", hint=HINT_LONG)
    if total > EXEC_TOTAL_BYTES:
        raise InputError(f"{key} and the run's environment need {total - RUN_ENV_ALLOWANCE} bytes together; at "
                         f"most {EXEC_TOTAL_BYTES - RUN_ENV_ALLOWANCE} fit a program's start on the target",
                         hint=HINT_LONG)


def check(launch) -> None:
    """A deploy's, restart's or playbook's inputs, as every op of its locked call will send them."""
    settings, inputs, target = launch.settings, launch.inputs, launch.target
    project = settings.project.name
    if len(project) > PROJECT_CHARS:
        raise InputError(f"[project] name is {len(project)} characters long; at most {PROJECT_CHARS}",
                         hint="choose a shorter name")
    for key, value in (("[paths] root", target.root), ("[paths] checkpoints", target.checkpoints)):
        if value is not None:
            _string(value, key, hint="choose a shorter path")
    _string(launch.book.name, "playbook name", hint="choose a shorter name")
    for i, pattern in enumerate(settings.checkpoints.ignore):
        _string(pattern, f"[checkpoints] ignore[{i}]", hint="use shorter patterns")
    if len(settings.checkpoints.ignore) > MAX_ARGS:
        raise InputError(f"[checkpoints] ignore has {len(settings.checkpoints.ignore)} patterns; at most {MAX_ARGS}",
                         hint="use fewer, broader patterns")
    if settings.trash.max_gb and settings.trash.max_gb * (1 << 30) > MAX_ID:
        raise InputError(f"[trash] max_gb = {settings.trash.max_gb:g} is out of range; at most {MAX_ID >> 30}",
                         hint="set [trash] max_gb to a size in GB, or remove it")
    if settings.trash.keep and settings.trash.keep > MAX_ID:
        raise InputError(f"[trash] keep = {settings.trash.keep} is out of range; at most {MAX_ID}",
                         hint="set [trash] keep to a number of entries")
    for key in ("stop_timeout", "term_timeout", "lock_timeout", "wait"):
        value = getattr(settings.run, key)
        if not 0 <= value <= MAX_SECONDS:
            raise InputError(f"[run] {key} = {value:g} is out of range; at most {MAX_SECONDS:g} seconds",
                             hint=f"set [run] {key} to a number of seconds")
    for step in launch.book.steps:
        where = f"playbook {launch.book.name} {step.step} step"
        if step.step == "preflight" and not 0 <= step.min_free_mb <= MAX_FREE_MB:
            raise InputError(f"{where}: min_free_mb = {step.min_free_mb} is over {MAX_FREE_MB}",
                             hint="give the free space it needs in MB")
        if step.step != "shell":
            continue
        if len(step.argv) > MAX_ARGS:
            raise InputError(f"{where} has {len(step.argv)} arguments; at most {MAX_ARGS}", hint="run a script instead")
        for i, word in enumerate(step.argv):
            _string(word, f"{where} argv[{i}]", hint="run a script instead")
        if step.timeout > MAX_SECONDS:
            raise InputError(f"{where}: timeout = {step.timeout:g} is over {MAX_SECONDS:g} seconds",
                             hint="give a number of seconds")
        _string(f"{target.root.rstrip('/')}/revisions/{'0' * 16}", f"{where}'s folder (under [paths] root)",
                hint="choose a shorter [paths] root")
    if inputs.command is None:
        return
    commands.check(inputs.command)
    if isinstance(inputs.command, str):
        named = commands.references(inputs.command, list(launch.secrets))
        if named:
            raise InputError(f"[project] command expands secret {', '.join(named)}: its value would be in the "
                             "command line of the run's process, which any user of the target can read",
                             hint=f"read {named[0]} from the environment in the training script instead")
    check_start(inputs.argv or [], launch.env, launch.secrets)
