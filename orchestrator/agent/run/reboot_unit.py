"""``[run] resume_after_reboot``: a systemd unit on the target that starts a run's supervisor again after boot.

The unit is written (with its ``multi-user.target.wants`` link, which is all ``systemctl enable`` does) when
the run starts, and removed when it ends or is stopped, so no ``systemctl`` call and no daemon-reload is
needed: systemd reads it at the next boot. Only where systemd runs (``/run/systemd/system``); elsewhere
``install`` says why not and the run is reported ``lost`` after a reboot.

    install(run_dir, python="/usr/bin/python3", agent="/ws/orch/agent/agent-3.pyz") -> "" or why not
    remove(run_dir)

A project's queue (``runqueue``) has a unit too, keyed by its folder, whose command is ``queue-boot``.
"""

from __future__ import annotations

import os
import shlex

from ..layout import write_atomic

SYSTEMD_RUNNING = "/run/systemd/system"
UNITS = "/etc/systemd/system"


def unit_name(run_dir: str) -> str:
    """``orch-resume-<8 hex of the run folder>.service``: one per run, per orch root."""
    import hashlib

    return "orch-resume-" + hashlib.sha256(os.path.normpath(run_dir).encode()).hexdigest()[:8] + ".service"


def _paths(run_dir: str, units: str) -> tuple[str, str]:
    name = unit_name(run_dir)
    return os.path.join(units, name), os.path.join(units, "multi-user.target.wants", name)


def unit_text(run_dir: str, python: str, agent: str, command: list | None = None) -> str:
    what = f"start the queue in {run_dir}" if command else f"resume the run in {run_dir}"
    argv = [python, agent, *(command or ["resume", run_dir])]
    return (f"[Unit]\nDescription=orch: {what} after a reboot\n"
            "After=local-fs.target network.target\n\n"
            f"[Service]\nType=oneshot\nExecStart={shlex.join(argv)}\n"
            "RemainAfterExit=yes\nKillMode=process\n\n"  # the run's tmux server outlives ExecStart
            "[Install]\nWantedBy=multi-user.target\n")


def install(run_dir: str, python: str, agent: str, units: str = UNITS, running: str = SYSTEMD_RUNNING,
            command: list | None = None) -> str:
    """Install the unit (``command``: the agent's arguments, default ``resume run_dir``); return "" on success,
    else why it was not (no systemd, not root)."""
    if not os.path.isdir(running):
        return "the target does not run systemd"
    unit, wants = _paths(run_dir, units)
    try:
        write_atomic(unit, unit_text(run_dir, python, agent, command).encode())
        os.makedirs(os.path.dirname(wants), exist_ok=True)
        if not os.path.islink(wants):
            os.symlink(unit, wants)
    except OSError as exc:
        return f"cannot write {unit}: {exc.strerror}"
    return ""


def installed(run_dir: str, units: str = UNITS) -> bool:
    return os.path.exists(_paths(run_dir, units)[0])


def installed_names(units: str = UNITS) -> set[str]:
    """The names of every orch unit installed (runs' and queues'): one listing of the units folder."""
    try:
        return {name for name in os.listdir(units) if name.startswith("orch-resume-")}
    except OSError:
        return set()


def remove(run_dir: str, units: str = UNITS) -> None:
    for path in reversed(_paths(run_dir, units)):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
