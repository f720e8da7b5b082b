"""What a page changes or asks a target, done by the CLI's own commands: the same code, the same promises.

A stop is ``orch stop -e ID --json``, a restart ``orch restart -e ID --clean-checkpoints --yes --json`` (its checkpoints
moved to the trash, never deleted; the page asked first, showing what ``--dry-run`` says will move), a queue
removal ``orch queue remove ID --json``, a sweep's stop ``orch sweep stop ID --json``; a comparison, a sweep's
ranking, a target's GPUs, checkpoints and status are their ``--json`` answers. Each runs as its own process, as if typed in the project
folder, so a slow target never holds up the server, and its answer is the command's JSON or its ``error:`` and
``hint:`` lines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

from ..config import Settings
from ..errors import InputError
from ..records.experiments import Experiment
from .recent import RECENT

TIMEOUT_S = 600.0  # a stop waits for its run's grace periods; a restart pushes a revision
NICE = 10  # how far behind a user's commands the reads a page repeats run (a status, the checkpoints, the GPUs)


@dataclass
class Answer:
    ok: bool
    data: object  # the command's JSON, or {"error": ..., "hint": ...}
    exit_code: int


def orch(settings: Settings, *args: str, timeout: float = TIMEOUT_S, behind: bool = False) -> Answer:
    """``orch ARGS`` run in the project folder with this project's orch.toml; stdin closed (never a prompt).
    ``behind``: a read a page asks again and again, run behind the user's own commands (``run``)."""
    argv = [sys.executable, "-m", "orchestrator.main", "--config", str(settings.config_path), *args]
    try:
        done = run(argv, settings.project_dir, timeout, NICE if behind else 0)
    except subprocess.TimeoutExpired:
        return Answer(False, {"error": f"orch {' '.join(args)} took more than {timeout:g} s",
                              "hint": "see orch status; the command may still be running"}, 124)
    if done.returncode == 0:
        try:
            return Answer(True, json.loads(done.stdout or "null"), 0)
        except json.JSONDecodeError:
            return Answer(True, {"output": done.stdout}, 0)
    return Answer(False, _error(done.stderr), done.returncode)


def run(argv: list[str], cwd, timeout: float, nice: int = 0) -> subprocess.CompletedProcess:
    """``argv``'s process, its output and exit code; ``nice``: its CPU priority lowered by that much (and so the
    agents it starts), so that on a busy machine a user's own ``orch status`` is not the one that waits."""
    proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    if nice:
        try:
            os.setpriority(os.PRIO_PROCESS, proc.pid, os.getpriority(os.PRIO_PROCESS, 0) + nice)
        except OSError:
            pass  # (it runs ahead of a user's commands then: slower for them, no less right)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _error(stderr: str) -> dict:
    """The command's ``error:`` and ``hint:`` lines (else its last line)."""
    error = hint = None
    for line in stderr.splitlines():
        if line.startswith("error:"):
            error = line[len("error:"):].strip()
        elif line.startswith("hint:"):
            hint = line[len("hint:"):].strip()
    lines = [line for line in stderr.splitlines() if line.strip()]
    return {"error": error or (lines[-1] if lines else "the command failed"), "hint": hint}


def target_args(settings: Settings, exp: Experiment) -> list[str]:
    """The ``--target``/``--ct`` flags that reach where ``exp`` ran, as ``orch logs -e`` finds it."""
    from ..watch.metrics_view import target_flags

    name, ct = target_flags(settings, exp)
    return ["--ct", str(ct)] if ct is not None else ["--target", name] if name else []


def stop(settings: Settings, exp: Experiment) -> Answer:
    return _changes(exp, orch(settings, "stop", "-e", str(exp.id), "--json"))


def restart(settings: Settings, exp: Experiment, *, dry_run: bool) -> Answer:
    """Relaunch ``exp``'s revision and settings where it ran, with the checkpoints there moved to the trash first."""
    if exp.nodes:
        raise InputError(f"experiment {exp.id} is a job over several nodes",
                         hint=f"orch restart -e {exp.id} restarts a job on every node")
    extra = ["--dry-run"] if dry_run else ["--yes"]
    return _changes(exp, orch(settings, "restart", "-e", str(exp.id), "--clean-checkpoints", *extra, "--json"))


def queue_remove(settings: Settings, exp: Experiment) -> Answer:
    return _changes(exp, orch(settings, "queue", "remove", str(exp.id), *target_args(settings, exp), "--json"))


def _changes(exp: Experiment, answer: Answer) -> Answer:
    """``answer`` of a command that changed ``exp``: what was kept of its target's answers is asked anew."""
    RECENT.forget(exp.id)
    return answer


def sweep_stop(settings: Settings, sweep_id: str) -> Answer:
    return orch(settings, "sweep", "stop", sweep_id, "--json")


def compare(settings: Settings, ids: list[int]) -> Answer:
    """``orch experiments compare --json``: stale metrics read from the targets first."""
    return orch(settings, "experiments", "compare", *map(str, ids), "--json", timeout=120)


def sweep(settings: Settings, sweep_id: str) -> Answer:
    return orch(settings, "sweep", "show", sweep_id, "--json", timeout=120)


def gpus(settings: Settings) -> Answer:
    return orch(settings, "gpus", "--json", timeout=60, behind=True)


def checkpoints(settings: Settings, exp: Experiment) -> Answer:
    """``orch checkpoints list -e ID --json``: the folder the experiment ran with, and its trash (a recent answer
    again: ``recent``)."""
    return RECENT.get(("checkpoints", str(settings.config_path), exp.id),
                      lambda: orch(settings, "checkpoints", "list", "-e", str(exp.id), *target_args(settings, exp),
                                   "--json", timeout=60, behind=True))


def status(settings: Settings, exp: Experiment) -> Answer:
    """``orch status --json`` of the experiment's target: its run's attempts, guard progress and verdict (a recent
    answer again: ``recent``)."""
    return RECENT.get(("status", str(settings.config_path), exp.id),
                      lambda: orch(settings, "status", *target_args(settings, exp), "--json", timeout=60,
                                   behind=True))
