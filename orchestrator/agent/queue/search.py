"""A searching sweep conducted on its target, kept alive as the target keeps its queue; the one agent importer of
optuna (launch/study.py is the controller's).

``orch sweep --on-target`` hands the sweep here: the study (Optuna's SQLite file, the trials asked so far),
its spec, and the first trial's queue entry, kept as the template of every later one (a trial differs from it in
its ``project.env`` values, its budget, its number and the experiment number the controller reserved for it).
The conductor (``search_loop``) then runs on the target, in a Python that imports Optuna (the project's env,
or the agent's own), asks each trial, queues it in the project's queue, reads its log with the agent's metric
reader and stops a pruned one as ``orch stop`` does. No controller is needed to go on:

- a conductor killed or crashed: the process that started it (``search_loop.conduct``) starts it again, and
  should that one be gone too, the end of the sweep's next trial does (``revive``, from the supervisor);
- a reboot: a systemd unit (``reboot_unit``, keyed by the sweep's folder) starts it again (``sweep-boot``);
- the controller reads the study back (``read``: a copy the conductor writes between rounds) and records the
  trials the target started as experiments of the sweep (``launch/sweep_target.py``).

    <root>/sweeps/<project>/<sweep>/{spec.json, template.json, study.db, study.snapshot.db, conductor.log, .lock}
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import signal
import subprocess
import sys
import time

from ..layout import Layout, read_json, write_atomic, write_json
from ..protocol import AgentFailure
from ..run import reboot_unit
from . import runqueue

FOLDER = "sweeps"
IMPORT_WAIT = 120.0  # s a Python gets to import optuna when probed (a cold disk, a loaded target)


def folder(layout: Layout, project: str, sweep: str) -> str:
    return os.path.join(layout.root, FOLDER, project, sweep)


# -- Optuna's sampler and pruner, as both sides set them up -----------------------------------------------------
def optuna_module():
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def sampler(optuna, name: str, grid: dict, trials: int, seed: int | None):
    """``grid``: each axis's choices (a grid sampler's)."""
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        return optuna.samplers.GridSampler({k: list(v) for k, v in grid.items()}, seed=seed)
    # Optuna's default of 10 random trials first would leave a dozen-trial sweep nearly all random
    return optuna.samplers.TPESampler(n_startup_trials=max(3, min(10, trials // 3)), seed=seed)


def pruner(optuna, name: str, first_rung: int):
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=0)
    if name == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=first_rung, reduction_factor=3)
    return optuna.pruners.NopPruner()


def threshold(prune: str, mode: str, values: list[float]) -> float | None:
    """The value a trial had to beat at a rung, as each pruner reckons it from the others' values there: their
    median (median: the complete trials'), or the cut-off of the best third (asha: every trial that reached it)."""
    import math
    import statistics

    ranked = sorted(values, reverse=mode == "max")
    if not ranked:
        return None
    if prune == "asha":
        return ranked[max(0, math.ceil(len(ranked) / 3) - 1)]
    return statistics.median(ranked)


# -- the conductor's lock: one per sweep, wherever it runs ------------------------------------------------------
def locked(lock_path: str) -> int | None:
    """The sweep's conductor lock (an fd), or None when another conductor holds it."""
    os.makedirs(os.path.dirname(lock_path), exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


def holder(lock_path: str) -> int | None:
    """The pid of the live conductor holding ``lock_path``, or None."""
    if not os.path.exists(lock_path):
        return None
    fd = os.open(lock_path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        try:
            return int(os.read(fd, 32) or b"0") or None
        except ValueError:
            return None
    finally:
        os.close(fd)
    return None


# -- ops -------------------------------------------------------------------------------------------------------
def probe(layout: Layout, pythons: list) -> dict:
    """The first of ``pythons`` (then the agent's own) that imports optuna: the one the conductor runs in."""
    tried = []
    for python in [*[p for p in pythons if p], sys.executable]:
        try:
            done = subprocess.run([python, "-c", "import optuna"], stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=IMPORT_WAIT, cwd="/")
        except (OSError, subprocess.TimeoutExpired) as exc:
            tried.append(f"{python}: {exc}")
            continue
        if done.returncode == 0:
            return {"python": python, "tried": tried}
        last = (done.stderr.decode("utf-8", "replace").strip().splitlines() or ["exit %d" % done.returncode])[-1]
        tried.append(f"{python}: {last}")
    return {"python": None, "tried": tried}


def start(layout: Layout, project: str, sweep: str, spec: dict | None = None, study: str | None = None) -> dict:
    """Hand a sweep to this target (``spec`` and ``study``, base64 of its file) or, with neither, start its
    conductor again; the first trial's queue entry is kept as every trial's template."""
    where = folder(layout, project, sweep)
    if spec is not None:
        template = runqueue.entry(layout, project, int(spec["template"]), spec.get("registry"))
        if template is None and not os.path.exists(os.path.join(where, "template.json")):
            raise AgentFailure("notfound", f"the first trial of sweep {sweep} (experiment {spec['template']}) is "
                                           "not in the queue", "start the sweep again")
        if template is not None:
            venv = (template.get("env") or {}).get("VIRTUAL_ENV")
            found = probe(layout, [os.path.join(venv, "bin", "python")] if venv else [])
            if found["python"] is None:
                raise AgentFailure("input", "no Python on the target imports optuna, which the sweep's conductor "
                                            "needs there (" + "; ".join(found["tried"])[:600] + ")",
                                   "add optuna to the project's [env] requirements, or install it for the target's "
                                   "python3; or drop --on-target: the controller conducts the sweep")
            spec = dict(spec, python=found["python"])
        os.makedirs(where, exist_ok=True)
        if template is not None:  # the user's variables are in it, as in the entry: 0600
            write_atomic(os.path.join(where, "template.json"), json.dumps(template).encode(), 0o600)
        if study is not None:
            write_atomic(os.path.join(where, "study.db"), base64.b64decode(study), 0o600)
        write_json(os.path.join(where, "spec.json"), dict(spec, ended=None))
    found = read_json(os.path.join(where, "spec.json"))
    if not isinstance(found, dict):
        raise AgentFailure("notfound", f"no sweep {sweep} on this target", "orch sweep show lists its trials")
    if found.get("ended"):
        return {"pid": None, "ended": found["ended"]}
    why = reboot_unit.install(where, found["python"], os.path.abspath(sys.argv[0]),
                              command=["sweep-boot", layout.root, project, sweep])
    pid = spawn(layout, project, sweep)
    return {"pid": pid, "boot": why or "started again after a reboot by the sweep's systemd unit"}


def spawn(layout: Layout, project: str, sweep: str) -> int | None:
    """The sweep's conductor, detached (a session of its own, its output in conductor.log), unless one runs or
    the sweep has ended; returns the pid of the one running."""
    where = folder(layout, project, sweep)
    spec = read_json(os.path.join(where, "spec.json"), {}) or {}
    live = holder(os.path.join(where, ".lock"))
    if live is not None or not spec or spec.get("ended"):
        return live
    with open(os.path.join(where, "conductor.log"), "ab") as out:
        child = subprocess.Popen([spec["python"], os.path.abspath(sys.argv[0]), "sweep-conduct", layout.root,
                                  project, sweep], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True, close_fds=True, cwd="/")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # once it holds the lock, a read says it runs
        live = holder(os.path.join(where, ".lock"))
        if live is not None or child.poll() is not None:
            return live
        time.sleep(0.05)
    return child.pid


def read(layout: Layout, project: str, sweep: str) -> dict:
    """The study as the conductor last left it (its copy between rounds while it runs), and whether it runs."""
    where = folder(layout, project, sweep)
    spec = read_json(os.path.join(where, "spec.json"))
    if not isinstance(spec, dict):
        raise AgentFailure("notfound", f"no sweep {sweep} on this target", "orch sweep show lists its trials")
    live = holder(os.path.join(where, ".lock"))
    name = "study.snapshot.db" if live is not None and os.path.exists(os.path.join(where, "study.snapshot.db")) \
        else "study.db"
    with open(os.path.join(where, name), "rb") as fh:
        data = fh.read()
    return {"study": base64.b64encode(data).decode(), "conductor": live, "ended": spec.get("ended")}


def stop(layout: Layout, project: str, sweep: str) -> dict:
    """End the conductor (SIGTERM: it finishes its round) and keep it from starting again; its pid."""
    where = folder(layout, project, sweep)
    spec = read_json(os.path.join(where, "spec.json"))
    if not isinstance(spec, dict):
        return {"stopped": None}
    write_json(os.path.join(where, "spec.json"), dict(spec, ended=spec.get("ended") or "stopped"))
    reboot_unit.remove(where)
    pid = holder(os.path.join(where, ".lock"))
    if pid is not None:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return {"stopped": None}
        deadline = time.monotonic() + 30
        while holder(os.path.join(where, ".lock")) == pid and time.monotonic() < deadline:
            time.sleep(0.1)
    return {"stopped": pid}


# -- kept alive ------------------------------------------------------------------------------------------------
def boot(root: str, project: str, sweep: str) -> int:
    """``agent sweep-boot ROOT PROJECT SWEEP``: the sweep's unit after a reboot; starts the conductor detached
    (the unit is a oneshot: it must return) and ends."""
    pid = spawn(Layout(root), project, sweep)
    print(f"orch: sweep {sweep} of {project} after boot: conductor {pid}", flush=True)
    return 0


def revive(run_dir: str) -> None:
    """From the supervisor of a run that ended: a trial of a sweep conducted here whose conductor is gone (killed)
    starts it again, so the next trial is asked with nobody at the terminal."""
    if not os.path.exists(os.path.join(run_dir, "exit.json")):
        return  # the system is going down: the sweep's unit starts it after boot
    exp = read_json(os.path.join(run_dir, "experiment.json"), {}) or {}
    if not exp.get("sweep") or not exp.get("project"):
        return
    root = os.path.dirname(os.path.dirname(os.path.normpath(run_dir)))
    try:
        layout = Layout(root)
        if os.path.exists(os.path.join(folder(layout, str(exp["project"]), str(exp["sweep"])), "spec.json")):
            spawn(layout, str(exp["project"]), str(exp["sweep"]))
    except (OSError, AgentFailure, KeyError):
        pass  # the next orch sweep show or resume starts it
