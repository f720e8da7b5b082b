"""Into the run: attach to its tmux pane, run a command in its work folder, a shell, a forwarded port.

Where things are comes from the layout the agent uses (``agent/layout.py``, ``agent/run/runs.py``,
``agent/run/workdir.py``): the run's tmux session ``orch-<project>`` lives on orch's private socket for the
target's root, a revision is unpacked in ``<root>/revisions/<rev>``, and a run works in
``<root>/runs/<key>/work`` (runs of an older orch worked in their revision folder). The terminal and port plumbing is in
``transport/interactive.py``.
"""

from __future__ import annotations

import hashlib
import posixpath
import sys
from typing import Callable

from ..config import Settings
from ..errors import CommandNotFound, InputError, NotFoundError
from ..records.experiments import Registry
from ..reach.targets import Target
from ..reach.transport.base import Transport


def tmux_socket(root: str) -> str:
    """orch's tmux socket name for a target root (the agent's ``runs.socket_name``)."""
    return "orch-" + hashlib.sha256(posixpath.normpath(root).encode()).hexdigest()[:8]


def attach_argv(settings: Settings, target: Target, experiment: int | None = None) -> list[str]:
    """tmux attached to the project's session; ``experiment``: at its run's window (runs side by side)."""
    argv = ["tmux", "-L", tmux_socket(target.root)]
    if experiment is not None:  # one tmux command line: select the window, then attach (";" is tmux's separator)
        argv += ["select-window", "-t", f"={session(settings)}:=exp{experiment}", ";"]
    return argv + ["attach-session", "-t", f"={session(settings)}"]


def session(settings: Settings) -> str:
    return f"orch-{settings.project.name}"


def require_terminal(what: str) -> None:
    """Interactive commands need a terminal on stdin: say so instead of hanging or garbling a pipe."""
    import os

    try:
        ok = os.isatty(sys.stdin.fileno())
    except (AttributeError, OSError, ValueError):
        ok = False
    if not ok:
        raise InputError(f"orch {what} needs a terminal, and stdin is not one",
                         hint="run it from an interactive terminal; without one, `orch logs --follow` "
                              "shows the run and `orch exec -- CMD` runs a command")


def require_alive(settings: Settings, target: Target, transport: Transport) -> None:
    """The project's tmux session exists on the target: there is a run to attach to."""
    name = session(settings)
    result = transport.run(["tmux", "-L", tmux_socket(target.root), "has-session", "-t", f"={name}"])
    if not result.ok:
        raise NotFoundError(f"no run of project {settings.project.name} is alive on {target.label}",
                            hint="`orch status` says how the last one ended; `orch deploy` starts one")


def run_folder(settings: Settings, target: Target, registry: Registry, transport: Transport) -> str:
    """Where the latest experiment on this target works: its run's ``work`` folder, else (a run of an older
    orch) its revision folder; one of them must still be there."""
    exp = registry.latest(target.machine, target.name)
    if exp is None or not exp.revision:
        raise NotFoundError(f"no experiment on {target.label}, so no run folder to run in",
                            hint="`orch deploy` pushes one (or `orch use` picks the target you deployed to)")
    key = f"{reg}-{exp.id}" if (reg := registry.run_registry(exp.id)) else str(exp.id)
    work = posixpath.join(target.root, "runs", key, "work")
    revision = posixpath.join(target.root, "revisions", exp.revision)
    for folder in (work, revision):
        if transport.run(["test", "-d", folder]).ok:
            return folder
    raise NotFoundError(f"experiment {exp.id}'s work folder and revision {exp.revision} are no longer on "
                        f"{target.label}", hint="`orch deploy` pushes the code again (orch gc removed them)")


# the run's environment ([env]) first on the PATH of what exec and ssh start: a constant script, the env's folder
# and the command are its arguments (no shell reads them)
IN_ENV = 'VIRTUAL_ENV="$1"; PATH="$1/bin:$PATH"; export VIRTUAL_ENV PATH; shift; exec "$@"'
# a login shell reads the profile, which sets PATH: the env goes first after it, in the interactive shell it starts
SHELL_IN_ENV = ('cd -- "$2" 2>/dev/null; exec "${SHELL:-/bin/sh}" -l -c \'VIRTUAL_ENV="$1"; PATH="$1/bin:$PATH"; '
                'export VIRTUAL_ENV PATH; exec "${SHELL:-/bin/sh}" -i\' sh "$1"')


def venv_of(target: Target, registry: Registry) -> str | None:
    """The env (``[env]``) the latest experiment on this target started in: ``<root>/envs/<hash>``."""
    exp = registry.latest(target.machine, target.name)
    env_hash = ((exp.env or {}).get("hash") if exp is not None else None)
    return posixpath.join(target.root, "envs", env_hash) if env_hash else None


def in_env(argv: list[str], venv: str | None) -> list[str]:
    """``argv`` with the run's env first on its PATH (as the run had it)."""
    return ["sh", "-c", IN_ENV, "sh", venv, *argv] if venv else argv


# run by the target's python with the run's launch record and the command as arguments: the command gets the
# variables the run was given ([project] env, ORCH_EXPERIMENT_ID, ORCH_CHECKPOINT_DIR, ...) over the login
# environment it starts in, as the run's supervisor gives them (its PATH stays the login one, the env's first:
# ``in_env``); a run of an older orch, or one whose record is gone, adds nothing
RUN_VARIABLES = ("import json, os, sys\n"
                 "try:\n"
                 "    env = json.load(open(sys.argv[1])).get('env') or {}\n"
                 "except (OSError, ValueError, AttributeError):\n"
                 "    env = {}\n"
                 "os.environ.update({str(k): str(v) for k, v in env.items() if k != 'PATH'})\n"
                 "os.execvp(sys.argv[2], sys.argv[2:])\n")


def with_run_variables(target: Target, folder: str, argv: list[str]) -> list[str]:
    """``argv`` given the variables of the run that works in ``folder`` (its ``work`` folder: the record is
    beside it); a revision folder (a run of an older orch) has no record: ``argv`` as it is."""
    if posixpath.basename(folder.rstrip("/")) != "work":
        return argv
    return [target.python, "-c", RUN_VARIABLES, posixpath.join(posixpath.dirname(folder.rstrip("/")), "launch.json"),
            *argv]


def shell_in_env(venv: str, folder: str | None) -> list[str]:
    """A login shell in ``folder`` whose PATH starts with the run's env."""
    return ["sh", "-c", SHELL_IN_ENV, "sh", venv, folder or "."]


# run by the target's python with the folder and the program as arguments: no shell reads either
FIND = ("import os, shutil, sys\n"
        "os.chdir(sys.argv[1])\n"
        "p = sys.argv[2]\n"
        "found = os.path.isfile(p) and os.access(p, os.X_OK) if '/' in p else shutil.which(p)\n"
        "print(os.environ.get('PATH', ''))\n"
        "sys.exit(0 if found else 127)\n")


def require_program(target: Target, transport: Transport, folder: str, program: str,
                    venv: str | None = None) -> None:
    """The program ``orch exec`` runs is there, in ``folder`` or on the target's PATH (the run's env first):
    else exit 127 with a hint."""
    found = transport.run(in_env([target.python, "-c", FIND, folder, program], venv))
    if found.exit_code != 127:
        return
    path = found.stdout.decode("utf-8", "replace").strip()
    where = f"in {folder}" if "/" in program else f"on its PATH ({path})" if path else "(its PATH is empty)"
    raise CommandNotFound(f"{program}: command not found on {target.label} {where}",
                          hint=f"install {program} on the target, or give its full path "
                               "(orch ssh opens a shell there to look)")


def parse_ports(spec: str) -> tuple[int, int]:
    """``6006`` -> (6006, 6006); ``6006:16006`` -> (6006, 16006): the target's port, then the local one."""
    parts = spec.split(":")
    try:
        ports = [int(p) for p in parts]
    except ValueError:
        ports = []
    if len(ports) not in (1, 2) or not all(0 < p < 65536 for p in ports):
        raise InputError(f"bad port {spec!r}", hint="give PORT or PORT:LOCAL, e.g. 6006 or 6006:16006")
    return ports[0], ports[-1]


def forward_destination(target: Target, transport: Transport) -> tuple[Transport, str]:
    """The SSH transport to carry connections over, and the host to ask it for.

    Over SSH the target itself (its loopback); through pct the node, towards the CT's address.
    """
    from ..reach.transport.pct import PctTransport

    if not isinstance(transport, PctTransport):
        return transport, "127.0.0.1"
    address = target.spec.address or target.info.get("address")
    if not address:
        found = transport.run(["hostname", "-I"])
        address = (found.stdout.decode().split() or [None])[0] if found.ok else None
    if not address:
        raise NotFoundError(f"{target.label} has no address the node could forward to",
                            hint="set address = \"...\" on the target")
    return transport.node, address


def say_forwarding(target: Target, port: int, host: str, say: Callable[[str], None]) -> Callable[[str], None]:
    def ready(url: str) -> None:
        where = f"port {port} on {target.label}" if host == "127.0.0.1" else f"{host}:{port} ({target.label})"
        say(f"forwarding {url} -> {where}; Ctrl-C stops")
    return ready
