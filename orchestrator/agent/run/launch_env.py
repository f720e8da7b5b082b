"""What a run inherits from the command that launched it: its environment variables, umask and resource limits.

(Not its Python environment: that is ``envs.py``.) A run starts as if the user had typed its command where they
typed ``orch deploy``: on the local target with the environment of that shell (``capture`` in the ``orch`` command,
sent with the start), on a remote one with the target user's login environment (``own``: this agent's, as sshd gave
it, before the agent set its own locale). Never with the environment of a process that happens to be long-lived
there (the tmux server, a standby supervisor, a resident agent of a connection keeper): the supervisor takes what
the start recorded (``apply``) and gives it to every attempt, a resume after a reboot included.

The record is ``launch-env.json`` in the run folder, mode 0600 (its variables are the user's, their tokens
too), and never holds a ``[project] secrets`` value: those come through the pipe (``handover.py``). A queued launch
keeps it in its queue entry, 0600 as well, until it starts.

    ctx = capture()                 # {"env": {...}, "umask": 18, "limits": {"nofile": [1024, 1048576], ...}}
    write(run_dir, ctx, secrets)    # 0600, the secrets' names left out
    env = apply(read(run_dir))      # this process takes the umask and limits; the variables for the command

A window the user opens in the run's tmux session (``orch attach``, then tmux's new-window) is a shell with what the
run has (``window``, the session's ``default-command``), not the tmux server's environment.
"""

from __future__ import annotations

import json
import os

from ..layout import read_json, write_atomic
from ..protocol import AgentFailure

FILE = "launch-env.json"
# set by tmux for the pane the supervisor runs in: the run's tmux, never the launching shell's own
PANE = ("TMUX", "TMUX_PANE")
LIMITS = ("as", "core", "cpu", "data", "fsize", "locks", "memlock", "msgqueue", "nice", "nofile", "nproc", "rss",
          "rtprio", "rttime", "sigpending", "stack")

_ORIGINAL: dict | None = None  # this agent's environment when it started, before it set LC_ALL for tmux


def remember() -> None:
    """Keep this process's environment as it came (the agent's entry points call it before changing it)."""
    global _ORIGINAL
    if _ORIGINAL is None:
        _ORIGINAL = dict(os.environ)


def original() -> dict:
    """This agent's environment as the target gave it."""
    return dict(_ORIGINAL if _ORIGINAL is not None else os.environ)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def limits() -> dict:
    """This process's resource limits, by name: ``[soft, hard]``, -1 for unlimited."""
    import resource

    out = {}
    for name in LIMITS:
        which = getattr(resource, f"RLIMIT_{name.upper()}", None)
        if which is not None:
            try:
                out[name] = list(resource.getrlimit(which))
            except (OSError, ValueError):
                continue
    return out


def capture(env: dict | None = None) -> dict:
    """This process's variables (``env``: those instead), umask and limits: what a run it launches starts with."""
    return {"env": {str(k): str(v) for k, v in (os.environ if env is None else env).items()}, "umask": _umask(),
            "limits": limits()}


def own() -> dict:
    """The target's own: this agent's environment as it came, its umask and limits."""
    return capture(original())


def check(value: object, name: str = "launch_env") -> dict:
    """A launch environment from the wire, or a clean input failure."""
    def bad(what: str) -> AgentFailure:
        return AgentFailure("input", f"{name}: {what}", "the controller and agent versions differ")

    if not isinstance(value, dict):
        raise bad("not an object")
    env, mask, lims = value.get("env"), value.get("umask"), value.get("limits", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and k and "=" not in k and "\0" not in k
                                            and isinstance(v, str) and "\0" not in v for k, v in env.items()):
        raise bad("env must map variable names to strings")
    if type(mask) is not int or not 0 <= mask <= 0o777:
        raise bad("umask must be an integer in [0, 0o777]")
    if not isinstance(lims, dict) or not all(
            k in LIMITS and isinstance(v, list) and len(v) == 2 and all(type(x) is int and x >= -1 for x in v)
            for k, v in lims.items()):
        raise bad("limits must map limit names to [soft, hard]")
    return {"env": env, "umask": mask, "limits": lims}


def write(run_dir: str, ctx: dict, secrets: object = ()) -> None:
    """The run's record, 0600: its variables without the secrets' names (their values come through the pipe)."""
    write_atomic(*record(run_dir, ctx, secrets))


def record(run_dir: str, ctx: dict, secrets: object = ()) -> tuple[str, bytes, int]:
    """What ``write`` writes, as (path, data, mode): for ``layout.write_all`` with the run's other files."""
    env = {k: v for k, v in ctx["env"].items() if k not in secrets and k not in PANE}
    return os.path.join(run_dir, FILE), (json.dumps({**ctx, "env": env}, sort_keys=True) + "\n").encode(), 0o600


def read(run_dir: str) -> dict | None:
    """The run's record; None for a run started by an orch that kept none."""
    found = read_json(os.path.join(run_dir, FILE))
    try:
        return check(found) if found is not None else None
    except AgentFailure:
        return None


def apply(ctx: dict | None) -> tuple[dict, list[str]]:
    """Take the launch's umask and limits in this process (the command inherits them), and its variables for the
    command, with this pane's own (``PANE``); without a record, this process's. Also what could not be taken (a hard
    limit above this process's, which only a privileged process may raise)."""
    if ctx is None:
        return dict(os.environ), []
    import resource

    os.umask(ctx["umask"])
    missed = []
    for name, (soft, hard) in sorted(ctx["limits"].items()):
        which = getattr(resource, f"RLIMIT_{name.upper()}", None)
        if which is None:
            continue
        try:
            now = resource.getrlimit(which)
            if (soft, hard) == tuple(now):
                continue
            try:
                resource.setrlimit(which, (soft, hard))
            except (OSError, ValueError):  # a hard limit above ours: the soft one still, as far as ours goes
                top = now[1]
                resource.setrlimit(which, (soft if top == -1 or 0 <= soft <= top else top, top))
                missed.append(name)
        except (OSError, ValueError):
            missed.append(name)
    env = dict(ctx["env"])
    env.update({k: os.environ[k] for k in PANE if k in os.environ})
    return env, missed


def window(run_dir: str) -> int:
    """``agent.pyz window RUN_DIR``: an interactive shell in the run's work folder with the run's environment (its
    launch's, [project] env and orch's variables; never its secrets), its umask and limits."""
    env, _missed = apply(read(run_dir))
    launch = read_json(os.path.join(run_dir, "launch.json"), {}) or {}
    env.update({str(k): str(v) for k, v in (launch.get("env") or {}).items()})
    try:
        os.chdir(str(launch.get("cwd") or run_dir))
    except OSError:
        pass
    for shell in (env.get("SHELL"), "/bin/sh"):
        if shell:
            try:
                os.execve(shell, [shell, "-i"], env)
            except OSError:
                continue
    return 127
