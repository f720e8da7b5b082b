"""A failed guard's way back, on the target: the parent's revision, settings and checkpoints, running again.

Started by the guarded run's supervisor once the run has ended (``guard.Watch.after_exit``), in a process of
its own, holding the target's lock. Each step is journalled in the failed run's ``guard.jsonl`` before the next
one starts, and a step already done is never done again, so a rollback cut short (its process killed, the
container rebooted) is finished by the next agent call that reads the runs (``resume_pending``). A guarded run
lost inside its window (the container stopped under it) fails its guard there, or at the boot (its unit:
``at_boot``), and is rolled back the same way::

    stop       the failed run is over (its supervisor stopped it; stopped here if it still runs)
    trash_new  its own checkpoints go to a trash entry named after it (``<time>-exp13``)
    put_back   the trash entry its launch moved the parent's checkpoints into goes back, as it was
    start      the parent's revision, argv, environment and restart policy start as the kept experiment
               number, resuming from the parent's newest checkpoint (``ORCH_RESUME_FROM``)
    end

Whatever the cut, the target ends with one of the two runs, never both, never neither: the new run is over
before anything moves, and the parent starts only once its checkpoints are back.
"""

from __future__ import annotations

import os
import sys
import time

from .. import journal
from ..watch import guard_state
from . import launch_env, reboot_unit, runs
from ..layout import Layout, parse_run_key, read_json, remove_tree, write_json
from ..lock import TargetLock

PID = "guard.pid"
LOCK_WAIT_S = 600.0
# (a status asks ``resume_pending`` first: the guard's and the checkpoints' modules load only for a rollback)


def _restored_message(parent: object, failed: object) -> str:
    return f"restored from exp {parent} after the guard of exp {failed} failed"


def rollback(run_dir: str) -> int:
    from ..watch import guard

    run_dir = os.path.normpath(run_dir)
    layout = Layout(os.path.dirname(os.path.dirname(run_dir)))
    launch = read_json(os.path.join(run_dir, "launch.json"), {}) or {}
    spec = guard.Spec.from_dict((launch.get("recovery") or {}).get("guard"))
    if spec is None:
        print(f"orch: {run_dir} is not a guarded run", flush=True)
        return 2
    write_json(os.path.join(run_dir, PID), {"pid": os.getpid(), "start": runs._proc_start(os.getpid())})
    key = parse_run_key(os.path.basename(run_dir)) or (None, 0)
    failed_id = key[1]
    with TargetLock(layout.lock, LOCK_WAIT_S, f"rollback after the guard of experiment {failed_id}"):
        entries = guard.read_journal(run_dir)
        if any(e.get("event") == "end" for e in entries):
            return 0
        done = {e["step"]: e.get("value") for e in entries if e.get("event") == "done"}
        if not any(e.get("event") == "begin" for e in entries):
            guard.append(run_dir, {"event": "begin", "what": "rollback", "pid": os.getpid()})
        steps = (("stop", lambda: _stop(layout, run_dir, key)),
                 ("trash_new", lambda: _trash_new(layout, launch, failed_id)),
                 ("put_back", lambda: _put_back(layout, run_dir, launch)),
                 ("start", lambda: _start(layout, spec, failed_id)))
        for name, step in steps:
            if name in done:
                continue
            try:
                value = step()
            except Exception as exc:
                guard.append(run_dir, {"event": "failed", "step": name, "error": str(exc)[:500]})
                _state(run_dir, {"state": "rollback failed", "error": f"{name}: {exc}"[:500]})
                print(f"orch: rollback step {name} failed: {exc}", flush=True)
                return 1
            guard.append(run_dir, {"event": "done", "step": name, "value": value})
        guard.append(run_dir, {"event": "end"})
        _state(run_dir, {"state": "rolled back", "restored": spec.restore.get("id"), "rolled_back_at": time.time()})
    print(f"orch: rolled back to experiment {spec.parent.get('id')} as {spec.restore.get('id')}", flush=True)
    return 0


def _state(run_dir: str, fields: dict) -> None:
    path = os.path.join(run_dir, guard_state.STATE)
    write_json(path, (read_json(path, {}) or {}) | fields)


def _stop(layout: Layout, run_dir: str, key: tuple) -> dict:
    deadline = time.monotonic() + 30.0
    while runs.run_state(run_dir)["state"] in ("running", "launching") and time.monotonic() < deadline:
        time.sleep(0.05)  # its supervisor is recording the exit
    state = runs.run_state(run_dir)
    if state["state"] in ("running", "launching"):  # its supervisor died after deciding
        project = state.get("project")
        runs.stop(layout, project, [key[1]], 10.0, 5.0, by={"guard": True}, registry=key[0])
        state = runs.run_state(run_dir)
    return {"state": state["state"]}


def _trash_new(layout: Layout, launch: dict, failed_id: int) -> dict:
    folder = str((launch.get("env") or {}).get("ORCH_CHECKPOINT_DIR") or "")
    if not folder:
        return {"action": "none"}
    from ..ckpt import checkpoints

    moved = checkpoints.move_to_trash(layout, folder, folder, label=f"exp{failed_id}", moved_by=failed_id)
    return {k: moved.get(k) for k in ("action", "moved", "entry", "entry_path")}


def _put_back(layout: Layout, run_dir: str, launch: dict) -> dict:
    """The entry the failed run's launch moved the parent's checkpoints into (its journal's ``ckpt_trash``)."""
    from ..ckpt import checkpoints

    folder = str((launch.get("env") or {}).get("ORCH_CHECKPOINT_DIR") or "")
    moved = next((e.get("value") for e in journal.read(run_dir)
                  if e.get("event") == "done" and e.get("op") == "ckpt_trash"), None) or {}
    if not folder or not moved.get("entry"):
        return {"restored": 0}
    return checkpoints.restore(layout, folder, folder, moved["entry"])


def _start(layout: Layout, spec: guard.Spec, failed_id: int) -> dict:
    parent_dir = layout.run_dir(int(spec.parent["id"]), spec.parent.get("registry"))
    restore_id, registry = int(spec.restore["id"]), spec.restore.get("registry")
    target_dir = layout.run_dir(restore_id, registry)
    if os.path.lexists(target_dir):
        state = runs.run_state(target_dir)["state"]
        if os.path.exists(os.path.join(target_dir, "pid.json")) or state not in ("launching", "crashed"):
            return {"exp_id": restore_id, "state": state}  # it started before the cut
        remove_tree(layout.root, target_dir)  # made, never started: made again
    old = read_json(os.path.join(parent_dir, "launch.json"), {}) or {}
    exp = dict(read_json(os.path.join(parent_dir, "experiment.json"), {}) or {})
    batching = read_json(os.path.join(parent_dir, "batching.json"), {}) or {}
    env = {k: v for k, v in (old.get("env") or {}).items() if not k.startswith("ORCH_") and k != "PYTHONPATH"}
    recovery = {k: v for k, v in (old.get("recovery") or {}).items() if k != "guard"}
    message = _restored_message(spec.parent["id"], failed_id)
    exp.update(id=restore_id, parent=spec.parent["id"], message=message, status="running",
               restored={"from": spec.parent["id"], "guard_of": failed_id, "folder": os.path.basename(parent_dir)})
    for k in ("ended", "exit_code", "end_reason", "started", "attempts"):
        exp.pop(k, None)
    runs.start(layout, restore_id, str(exp.get("project")), str(old["revision"]), list(old["argv"]), env, exp,
               batching, os.path.abspath(sys.argv[0]), registry=registry, recovery=recovery,
               launch=launch_env.read(parent_dir))  # as the parent was launched
    state = runs.verify_started(layout, restore_id, wait=0.0, registry=registry)  # its command is spawned
    return {"exp_id": restore_id, "state": state["state"]}


def resume_pending(layout: Layout) -> None:
    """A rollback decided but not finished (its process gone: killed, or the container rebooted), or a guarded run
    lost inside its window (``resume_one``): start it (again)."""
    try:
        names = os.listdir(layout.runs)
    except OSError:
        return
    for name in names:
        resume_one(os.path.join(layout.runs, name))


def at_boot(run_dir: str) -> int:
    """The run's boot unit (``reboot_unit``): a guarded run lost inside its window fails its guard and is rolled
    back, with no orch connected; any other lost run is resumed (``runs.resume``)."""
    code = runs.resume(run_dir)  # a guard that watched fails there, and the run is not resumed
    resume_one(os.path.normpath(run_dir))
    return code


def resume_one(run_dir: str) -> bool:
    """This run's rollback, started unless it is on its way or not wanted; a run lost while its guard watched
    fails its guard first (``guard.fail_lost``) and is never resumed. Whether one was started."""
    state = guard_state.summary(run_dir)
    if not state or state.get("state") not in ("watching", "failed"):
        return False
    from ..watch import guard

    if state.get("state") == "watching":
        run = runs.run_state(run_dir)
        if run["state"] != "lost":
            return False
        reboot_unit.remove(run_dir)  # the rollback puts its parent back instead
        state = guard.fail_lost(run_dir, run.get("cause")) or guard.summary(run_dir)
    if not state or state.get("state") != "failed" or state.get("on_fail", "rollback") != "rollback":
        return False
    pid = read_json(os.path.join(run_dir, PID), {}) or {}
    if pid and runs._alive(pid.get("pid"), pid.get("start")):
        return False
    if not pid and runs.run_state(run_dir)["state"] == "running":
        return False  # its supervisor decided and is stopping it: it starts the rollback itself
    guard.spawn_rollback(run_dir, os.path.abspath(sys.argv[0]))
    write_json(os.path.join(run_dir, PID), {"pid": None, "spawned": time.time()})
    return True
