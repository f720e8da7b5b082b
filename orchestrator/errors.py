"""The one exception tree of orch.

Every error a user can meet is an ``OrchError`` carrying a message (what went wrong) and a hint
(what to do next). Third-party exceptions are translated into these at the module that owns the
library (``reach/transport/ssh.py`` for paramiko, ``reach/proxmox.py`` for proxmoxer, ...), so nothing above
those modules ever catches a foreign exception. The CLI maps each family to an exit code in one
place (``cli/main.py``).

    OrchError                      exit 1
    ├── InputError                 exit 2   bad flag, bad file, bad value given by the user
    │   └── ConfigError            exit 2   orch.toml / ORCH_* / --set failed validation
    ├── TargetError                exit 3   the target cannot be resolved or reached
    │   ├── ProxmoxError           exit 3   the Proxmox API refused or failed
    │   ├── CtNotRunning           exit 3   the CT is stopped (a launch starts it with --start)
    │   ├── WrongMachine           exit 3   another machine answered where the CT was (its host key is no proof)
    │   └── TransportError         exit 3   SSH / pct / subprocess transport failed
    │       ├── HostKeyError       exit 3   unknown or changed SSH host key
    │       └── TransportTimeout   exit 3   no answer within the configured time
    ├── RegistryError              exit 1   .orch/experiments.db cannot be used
    │   ├── DiskFull               exit 1   no space left to write it
    │   └── RegistryCorrupt        exit 1   not a readable SQLite file (orch experiments rebuild)
    ├── AgentError                 exit 4   the agent on the target reported a failure
    ├── ConflictError              exit 5   the target is busy (lock held, run in progress)
    ├── SafetyError                exit 6   refused to touch something unsafe (checkpoint paths)
    ├── NotFoundError              exit 7   no such experiment / trash entry / playbook
    │   └── CommandNotFound        exit 127 ``orch exec`` of a program the target does not have (as a shell says)
    └── Interrupted                exit 130 Ctrl-C (SIGTERM 143, SIGHUP 129): says what was done on the target
"""

from __future__ import annotations


class OrchError(Exception):
    """Base of every error orch reports to a user.

    ``detail`` is longer evidence kept off the one-line message (the agent's traceback), shown with
    ``orch --verbose``; ``partial`` holds the values of the agent operations that finished before it.
    """

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None, *, detail: str | None = None,
                 partial: list | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.detail = detail
        self.partial = list(partial or [])

    def __str__(self) -> str:
        return self.message


class InputError(OrchError):
    exit_code = 2


class ConfigError(InputError):
    exit_code = 2


class TargetError(OrchError):
    exit_code = 3


class ProxmoxError(TargetError):
    exit_code = 3


class CtNotRunning(TargetError):
    exit_code = 3


class WrongMachine(TargetError):
    exit_code = 3


class TransportError(TargetError):
    exit_code = 3


class HostKeyError(TransportError):
    exit_code = 3


class TransportTimeout(TransportError):
    exit_code = 3


class RegistryError(OrchError):
    exit_code = 1


class DiskFull(RegistryError):
    exit_code = 1


class RegistryCorrupt(RegistryError):
    exit_code = 1


class AgentError(OrchError):
    exit_code = 4


class ConflictError(OrchError):
    exit_code = 5


class SafetyError(OrchError):
    exit_code = 6


class NotFoundError(OrchError):
    exit_code = 7


class CommandNotFound(NotFoundError):
    exit_code = 127


class Interrupted(OrchError):
    """Ctrl-C (or SIGTERM, SIGHUP) during an operation; the message is the one-line truth of what the target did."""

    exit_code = 130

    def __init__(self, message: str, hint: str | None = None, exit_code: int | None = None) -> None:
        super().__init__(message, hint)
        if exit_code is not None:
            self.exit_code = exit_code


def extra_hint(extra: str, prefix: str | None = None) -> str:
    """The hint for a missing optional extra, in the words of the tool that installed the orch running now (its
    environment ``prefix``, ``sys.prefix``): pipx and uv keep a tool's environment to themselves, and a plain
    ``pipx install`` of an installed orch changes nothing. The name ``orch`` on PyPI is another project, so it
    says to install the extra from orch's own checkout or wheel (docs/install.md)."""
    import os
    import sys

    where = os.path.normpath(prefix or sys.prefix)
    parent, name = os.path.split(where)
    parts = where.split(os.sep)
    spec = f"'<orch checkout>[{extra}]'"
    # each tool leaves its mark in the environment (wherever PIPX_HOME or UV_TOOL_DIR put it), else its usual place
    if os.path.exists(os.path.join(where, "pipx_metadata.json")) or (os.path.basename(parent) == "venvs"
                                                                     and "pipx" in parts):
        return f"orch runs from pipx's environment {name!r}: add the extra with pipx install --force {spec} " \
               "(without --force, pipx leaves an installed orch as it is)"
    if os.path.exists(os.path.join(where, "uv-receipt.toml")) or (os.path.basename(parent) == "tools"
                                                                   and "uv" in parts):
        return f"orch runs from uv's tool environment {name!r}: add the extra with uv tool install --force {spec}"
    return f"install orch's {extra} extra from its checkout or wheel: pip install {spec}"


def cancelled(left: str, instead: str) -> InputError:
    """Every prompt's "no" (exit 2): ``left``, what was left as it was, and ``instead``, what to type to go on
    without being asked or to do the other thing, as its hint."""
    return InputError(f"cancelled: {left}", hint=instead)
