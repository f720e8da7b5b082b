"""A project's queue on the target: experiments that start, in order, when the one running ends.

Each queued launch is one file, ``queue/<project>/<time_ns>-<run key>.json``, holding the arguments of
``runs.start`` (its revision was assembled when it was queued, so it cannot change afterwards). Nothing on
the controller is needed to go on: the supervisor of a run that ends (``agent supervise``) forks a process
of its own session (``after_supervisor``) that waits for the supervisor to exit, takes the target's lock
and starts the oldest entry (``advance``); an entry queued beside (for free GPUs) of another project starts
then too, when the GPUs it waits for are free. After a reboot the queue's systemd unit
(``reboot_unit``, installed while the queue is not empty) does the same, unless a run of the project is
about to be resumed by its own unit: that run goes first, and its end starts the next. Where systemd is not
running, the next ``orch queue`` or ``orch status`` does it.

Why the oldest entry waits is kept beside it (``.waiting.json``) and shown with it (``entries``). An entry queued
beside that waits because nvidia-smi fails (which GPUs are free is unknown) is retried by a process of its own
(``agent queue-retry``, one per queue) every ``RETRY_S`` seconds, so that it starts once nvidia-smi answers again
with no orch command and no run's end.

Secrets are never stored on the target, so a launch with secrets cannot be queued (``add`` refuses it). What the
launch inherits (``launch_env``: the queueing command's environment, umask and limits) is kept in the entry, which is
therefore 0600, and the run starts with it however long it waits.

    add(layout, exp_id=3, project="tinylm", revision="r-…", argv=[...], env={...}, experiment={...},
        batching={...}, registry="a1b2c3d4e5f6") -> {"status": "queued", "position": 2}
    entries(layout, "tinylm") -> [{"id": 3, "registry": ..., "position": 1, ...}, ...]
    remove(layout, "tinylm", ids=[3]) -> {"removed": [3]}
    advance(layout, "tinylm") -> {"started": 3} or {"started": None, "why": "experiment 2 is running"}
"""

from __future__ import annotations

import json
import os
import sys
import time

from .. import journal, procstat
from ..run import launch_env, reboot_unit, runs
from . import gpu_share
from ..layout import Layout, read_json, run_key, write_atomic, write_json
from ..lock import TargetLock
from ..protocol import AgentFailure

FOLDER = "queue"
START_ARGS = ("exp_id", "project", "revision", "argv", "env", "experiment", "batching", "registry", "recovery",
              "launch", "use_standby")
LOCK_WAIT = 600.0  # s the process that starts the next entry waits for another operation's lock
PARENT_WAIT = 10.0  # s it waits for the supervisor that spawned it to exit (its tmux session is replaced)
RETRIED = "tried again every few seconds"  # in the why of an entry the retrier tries again
WAITING = ".waiting.json"  # why the oldest entry has not started: {"id", "why", "since", "retry"}
RETRY_S = 5.0  # s between the tries of an entry waiting for nvidia-smi to answer again
RETRY_FOR = 7 * 86400.0  # s after which the retrying process gives up (the next run's end or orch queue goes on)
LISTING_WAIT = 1.0  # s orch queue waits for the lock: an advance under way (a run just ended) shows its outcome




def folder(layout: Layout, project: str) -> str:
    return os.path.join(layout.root, FOLDER, project)


def _files(layout: Layout, project: str) -> list[str]:
    """The project's entries, oldest first (their names start with the time they were queued, in ns)."""
    try:
        names = os.listdir(folder(layout, project))
    except FileNotFoundError:
        return []
    return [os.path.join(folder(layout, project), n) for n in sorted(names)
            if n.endswith(".json") and not n.startswith(".")]


def entry(layout: Layout, project: str, exp_id: int, registry: str | None) -> dict | None:
    """The queued launch of experiment ``exp_id`` of ``registry``, as it was queued; None once it started (or
    was never queued)."""
    tail = f"-{run_key(exp_id, registry)}.json"
    path = next((p for p in _files(layout, project) if p.endswith(tail)), None)
    return read_json(path, None) if path else None


def entries(layout: Layout, project: str) -> list[dict]:
    """What is queued, in order: id, registry, revision, when, and the budget a sweep gave it."""
    out = []
    waits = read_json(os.path.join(folder(layout, project), WAITING), {}) or {}
    for position, path in enumerate(_files(layout, project), 1):
        entry = read_json(path, {}) or {}
        env = entry.get("env") or {}
        why = waits.get("why") if waits.get("id") == entry.get("exp_id") and waits.get("registry") == \
            entry.get("registry") else None
        out.append({"id": entry.get("exp_id"), "registry": entry.get("registry"), "position": position,
                    "revision": entry.get("revision"), "queued": entry.get("queued"),
                    "sweep": (entry.get("experiment") or {}).get("sweep"),
                    "max_steps": env.get("ORCH_MAX_STEPS"), "max_minutes": env.get("ORCH_MAX_MINUTES"),
                    "waiting": why})
    return out


def _unit_key(layout: Layout, project: str) -> str:
    return folder(layout, project)


def add(layout: Layout, exp_id: int, project: str, revision: str, argv: list, env: dict, experiment: dict,
        batching: dict, registry: str | None = None, recovery: dict | None = None, start_idle: bool = True,
        beside: dict | None = None, launch: dict | None = None, use_standby: bool = True) -> dict:
    """Queue a launch (under the target's lock); with ``start_idle``, start the queue at once when nothing of the
    project runs (a sweep queues every variant first, so that none competes with the queueing of the rest).
    ``beside`` (``{"gpus": N, "total": M}``): it starts next to the live runs once N GPUs are free (``gpu_share``).
    ``launch``: what the queueing command had (``launch_env``); without it, this agent's own."""
    if not os.path.isdir(layout.revision(revision)):
        raise AgentFailure("notfound", f"revision {revision} is not on the target", "deploy again to push it")
    run_dir = layout.run_dir(exp_id, registry)
    if os.path.lexists(run_dir) and not journal.only_launch(run_dir):
        raise AgentFailure("safety", f"run folder {run_dir} already exists; nothing was queued",
                           "give each project its own [paths] root, or remove the stale run folder")
    key = run_key(exp_id, registry)
    if any(os.path.basename(p).split("-", 1)[1] == f"{key}.json" for p in _files(layout, project)):
        raise AgentFailure("conflict", f"experiment {exp_id} is queued already", "see orch queue")
    os.makedirs(folder(layout, project), exist_ok=True)
    entry = {"exp_id": exp_id, "project": project, "revision": revision, "argv": list(argv), "env": dict(env),
             "experiment": dict(experiment), "batching": dict(batching), "registry": registry,
             "recovery": recovery or {}, "queued": time.time(),
             "launch": launch_env.check(launch) if launch is not None else launch_env.own(),
             "use_standby": use_standby} \
        | ({"beside": dict(beside)} if beside else {})
    write_atomic(os.path.join(folder(layout, project), f"{time.time_ns():020d}-{key}.json"),
                 (json.dumps(entry, indent=2, sort_keys=True) + "\n").encode(), 0o600)  # the user's variables
    why = reboot_unit.install(_unit_key(layout, project), sys.executable, os.path.abspath(sys.argv[0]),
                              command=["queue-boot", layout.root, project])
    started = _advance_locked(layout, project) if start_idle else {}
    if any(e["id"] == exp_id and e["registry"] == registry for e in started.get("started_all") or []):
        state = runs.run_state(run_dir)
        return {"status": "running", "started": state.get("started") or time.time(), "position": 0}
    busy = runs.alive_runs(layout, project)
    position = next((e["position"] for e in entries(layout, project) if e["id"] == exp_id
                     and e["registry"] == registry), None)
    return {"status": "queued", "position": position, "behind": busy[0]["id"] if busy else None,
            "boot": why or "resumed after a reboot by the queue's systemd unit"}


def remove(layout: Layout, project: str, ids: list | None = None, registry: str | None = None,
           sweep: str | None = None) -> dict:
    """Take entries out (``ids``; those of ``sweep``; none named: all of them), under the target's lock."""
    removed = []
    for path in _files(layout, project):
        entry = read_json(path, {}) or {}
        if registry is not None and entry.get("registry") not in (None, registry):
            continue
        if ids is not None and entry.get("exp_id") not in ids:
            continue
        if sweep is not None and (entry.get("experiment") or {}).get("sweep") != sweep:
            continue
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        removed.append(entry.get("exp_id"))
    if not _files(layout, project):
        reboot_unit.remove(_unit_key(layout, project))
    return {"removed": removed}


def _pending_resume(layout: Layout, project: str) -> dict | None:
    """A lost run of the project whose reboot unit is still in place: it resumes, so it goes first."""
    for found in runs.records(layout, project)["runs"]:
        if found["state"]["state"] == "lost" and reboot_unit.installed(os.path.join(layout.runs, found["folder"])):
            return found["state"]
    return None


def _advance_locked(layout: Layout, project: str) -> dict:
    """Start the oldest entry if nothing of the project runs (the caller holds the target's lock); entries queued
    ``beside`` start, in order, as long as the GPUs each wants are free (``started_all``: every one started).

    An entry that cannot start (its revision removed, its folder taken) is recorded as not started in its run
    folder and the next one is tried: a queue never sticks on a bad entry.
    """
    try:
        os.unlink(os.path.join(folder(layout, project), WAITING))  # said again below if the oldest still waits
    except FileNotFoundError:
        pass
    pending = _pending_resume(layout, project)
    if pending is not None:
        return {"started": None, "why": f"experiment {pending['id']} resumes after the reboot first"}
    started: list[dict] = []
    for path in _files(layout, project):
        entry = read_json(path, None)
        if not isinstance(entry, dict):
            os.unlink(path)
            continue
        args, why = _start_args(layout, entry)
        if why is not None:
            return _started(started) if started else _waits(layout, project, entry, why, RETRIED in why)
        try:
            runs.start(layout, agent_path=os.path.abspath(sys.argv[0]), **args)
        except AgentFailure as exc:
            run_dir = layout.run_dir(entry["exp_id"], entry.get("registry"))
            if not os.path.exists(os.path.join(run_dir, "launch.json")):
                os.makedirs(run_dir, exist_ok=True)
                runs.not_started(run_dir, f"queued, then could not start: {exc.message}"[:300])
            os.unlink(path)
            continue
        os.unlink(path)
        if not _files(layout, project):
            reboot_unit.remove(_unit_key(layout, project))
        started.append({"id": entry["exp_id"], "registry": entry.get("registry")})
        if not args.get("beside"):
            break  # the next waits for this one to end
    if started:
        return _started(started)
    reboot_unit.remove(_unit_key(layout, project))
    return {"started": None, "why": "the queue is empty"}


def _waits(layout: Layout, project: str, entry: dict, why: str, retry: bool) -> dict:
    """The oldest entry waits: why, kept for ``entries``; a wait on nvidia-smi starts the queue's retrier."""
    path = os.path.join(folder(layout, project), WAITING)
    old = read_json(path, {}) or {}
    same = old.get("id") == entry.get("exp_id") and old.get("why") == why
    write_json(path, {"id": entry.get("exp_id"), "registry": entry.get("registry"), "why": why, "retry": retry,
                      "since": old.get("since") if same else time.time()})
    if retry:
        _spawn_retry(layout, project)
    return {"started": None, "why": why}


def _spawn_retry(layout: Layout, project: str) -> None:
    import fcntl
    import subprocess

    lock = os.path.join(folder(layout, project), ".retry.lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return  # one retries already
    finally:
        os.close(fd)
    with open(os.path.join(folder(layout, project), ".advance.log"), "ab") as out:
        subprocess.Popen([sys.executable, os.path.abspath(sys.argv[0]), "queue-retry", layout.root, project],
                         stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                         close_fds=True, cwd="/")


def retry(root: str, project: str) -> int:
    """``agent queue-retry ROOT PROJECT``: try the queue every ``RETRY_S`` s while its oldest entry waits for
    nvidia-smi (one such process a queue, by its lock); it ends once the entry starts, the queue is empty, or the
    entry waits for something else (a run's end starts it then)."""
    import fcntl

    layout = Layout(root)
    fd = os.open(os.path.join(folder(layout, project), ".retry.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0
    deadline = time.monotonic() + RETRY_FOR
    while time.monotonic() < deadline:
        time.sleep(RETRY_S)
        try:
            done = advance(layout, project, wait=RETRY_S)
        except AgentFailure:
            continue  # another operation holds the lock: try again
        waits = read_json(os.path.join(folder(layout, project), WAITING), {}) or {}
        if done.get("started") is not None or not _files(layout, project) or not waits.get("retry"):
            print(f"orch: {time.strftime('%Y-%m-%d %H:%M:%S')} retried the queue of {project}: {done}", flush=True)
            return 0
    return 0


def _started(started: list[dict]) -> dict:
    return {"started": started[0]["id"], "registry": started[0]["registry"], "started_all": started}


def _start_args(layout: Layout, entry: dict) -> tuple[dict, str | None]:
    """``runs.start``'s arguments for the entry, or why it must wait: a run of the project is alive, or (an entry
    queued ``beside``) fewer GPUs are free than it wants; it then gets the free ones."""
    args = {k: entry.get(k) for k in START_ARGS if k in entry}  # an older orch's entry has fewer
    wanted = entry.get("beside")
    if not isinstance(wanted, dict):
        busy = runs.alive_runs(layout, str(entry.get("project")))
        return args, (f"experiment {busy[0]['id']} is running" if busy else None)
    found = gpu_share.table(layout, wanted.get("total"))
    placed = gpu_share.pick(found["gpus"], int(wanted.get("gpus") or 1))
    if placed is None and found.get("smi_failed"):
        return args, f"waiting for {wanted.get('gpus')} free GPU(s): nvidia-smi fails ({found['smi_failed']}), " \
                     f"{RETRIED}"
    if placed is None:
        held = "; ".join(f"GPU {r['index']}: " + (f"experiment {r['holder']['id']} ({r['holder'].get('project')})"
                                                   if r.get("holder") else str(r.get("busy")))
                         for r in found["gpus"] if r.get("holder") or r.get("busy"))
        said = f" ({held})" if held else f": {found['error']}" if found.get("error") else ""
        return args, f"waiting for {wanted.get('gpus')} free GPU(s){said}"
    args.update(env=gpu_share.environment(args["env"] or {}, placed),
                experiment={**(args["experiment"] or {}), "gpus": placed}, beside=True)
    return args, None


def advance(layout: Layout, project: str, wait: float = LOCK_WAIT) -> dict:
    """``_advance_locked`` under the target's lock (waited for up to ``wait`` s)."""
    if not _files(layout, project):
        return {"started": None, "why": "the queue is empty"}
    with TargetLock(layout.lock, wait, "start the next queued experiment"):
        return _advance_locked(layout, project)


def listing(layout: Layout, project: str, start_stale: bool = True) -> dict:
    """``orch queue``: the entries in order; with ``start_stale``, a queue nothing will start (no run of the
    project alive, none to resume, e.g. after a reboot where systemd is not running) is started first."""
    started = None
    if start_stale and _files(layout, project):
        try:
            started = advance(layout, project, wait=LISTING_WAIT)
        except AgentFailure:
            started = None  # another operation holds the lock: it, or the next command, starts it
    return {"queue": entries(layout, project), "started": (started or {}).get("started")}


def waiting(layout: Layout, project: str) -> list[str]:
    """The queues the end of a run of ``project`` may start: its own, then each other project's whose oldest entry
    waits beside for GPUs (a GPU a run frees is free for every project's)."""
    found = [project] if _files(layout, project) else []
    try:
        others = sorted(os.listdir(os.path.join(layout.root, FOLDER)))
    except FileNotFoundError:
        others = []
    for name in others:
        first = _files(layout, name)[:1] if name != project else []
        if first and isinstance((read_json(first[0], {}) or {}).get("beside"), dict):
            found.append(name)
    return found


def after_supervisor(run_dir: str) -> None:
    """From the supervisor (``agent supervise``) once its run has ended: start the next queued experiments (its
    project's, and those of other projects waiting for the GPUs it frees) in a forked process of its own session,
    which has the agent loaded already (an idle GPU waits for no Python start-up) and outlives the tmux session
    that the next start replaces."""
    if not os.path.exists(os.path.join(run_dir, "exit.json")):
        return  # the system is going down under the run: it resumes, or the queue's unit goes on, after boot
    exp = read_json(os.path.join(run_dir, "experiment.json"), {}) or {}
    root = os.path.dirname(os.path.dirname(os.path.normpath(run_dir)))
    projects = waiting(Layout(root), str(exp["project"])) if exp.get("project") else []
    if not projects:
        return
    supervisor = os.getpid()
    try:
        pid = os.fork()
    except OSError:
        return  # the next orch queue starts it
    if pid:
        return
    code = 1
    try:
        os.setsid()
        fd = os.open(os.path.join(root, FOLDER, projects[0], ".advance.log"),
                     os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        code = next_after(run_dir, supervisor, projects)
    finally:
        os._exit(code)


def next_after(run_dir: str, supervisor: int, projects: list[str]) -> int:
    """Wait for the supervisor (``supervisor``, its pid) to exit, then start the next entry of each of
    ``projects`` (a start of its own project replaces the tmux session the supervisor ran in)."""
    deadline = time.monotonic() + PARENT_WAIT
    while not procstat.exited(supervisor) and time.monotonic() < deadline:
        time.sleep(0.005)
    root = os.path.dirname(os.path.dirname(os.path.normpath(run_dir)))
    code = 0
    for project in projects:
        try:
            done = advance(Layout(root), project)
        except AgentFailure as exc:
            print(f"orch: the next queued experiment of {project} was not started: {exc.message}", flush=True)
            code = 1
            continue
        print(f"orch: {time.strftime('%Y-%m-%d %H:%M:%S')} after {os.path.basename(run_dir)}: {project}: {done}",
              flush=True)
    return code


def at_boot(root: str, project: str) -> int:
    """``agent queue-boot ROOT PROJECT``: the queue's unit after a reboot."""
    try:
        done = advance(Layout(root), project)
    except AgentFailure as exc:
        print(f"orch: the queue of {project} was not resumed: {exc.message}", flush=True)
        return 1
    print(f"orch: queue of {project} after boot: {done}", flush=True)
    return 0
