"""Runs in tmux: start, supervise, stop gracefully, and discover how they ended.

Every run lives in ``runs/<id>/``: ``experiment.json`` (the record), ``launch.json`` (argv, cwd,
env, the names of its secrets: their values pass through a pipe, see ``handover.py``), ``launch-env.json`` (0600: the
variables, umask and limits of the command that launched it, which every attempt starts from: ``launch_env.py``),
``train.log``
(all output), ``pid.json`` and ``exit.json`` (written by the supervisor, because tmux 3.3a loses dead
panes' exit statuses) and ``work/`` (its working folder: the revision's files and what the run writes beside
them, its modules' ``__pycache__/`` included; see ``workdir.py``). The tmux pane runs the supervisor, never a
shell string. Every attempt of a run, and its resume after a reboot, starts in the same work folder.

A project's runs share one tmux session (``orch-<project>``), one window each (``exp<id>``). The session is
replaced (killed, made again) only when no live run is in it; a run started beside others, or resumed after a
reboot while another has resumed already, gets a window of its own in it instead (``tmux.py``).

A shutdown of the container (its init's SIGTERM to every process) is not a stop: ``orch stop`` leaves
``stop_requested`` first, a shutdown does not, and the system says it is going down (``causes.shutting_down``).
The supervisor then records no exit and leaves the reboot unit in place: the run reads as ``lost``, interrupted
by the shutdown (``pid.json``'s ``interrupted``), until the attempt after boot resumes it.
"""

from __future__ import annotations

import json
import os
import sys
import time

from .. import procstat
from ..watch import budget, guard_state
from . import recorded, sacct, slurm
from ..watch import notify as notices
from ..layout import Layout, json_bytes, parse_run_key, read_json, write_all, write_atomic, write_json
from ..protocol import AgentFailure

# A status (``run_state``, ``status``) imports only the modules above: what starts, supervises and stops a run
# (subprocess and the supervisor's modules: their dataclasses pull in inspect and ast) is imported by the function
# that needs it, so an agent call that only reads costs none of them.

LOG = "train.log"
POLL_S = 0.01  # how often a wait for a run's files looks again: stat calls, cheap
JOB_NODE_KEYS = ("rank", "ct", "target", "label", "machine")  # what a run of a job says of each of its nodes


def socket_name(layout: Layout) -> str:
    """A private tmux server per orch root, so targets (and tests) never share sessions."""
    import hashlib

    return "orch-" + hashlib.sha256(layout.root.encode()).hexdigest()[:8]


def session_name(project: str) -> str:
    return f"orch-{project}"


_proc_start = procstat.start
_alive = procstat.alive


def run_state(run_dir: str) -> dict:
    """What a run is doing now, read from its files and /proc (never from tmux)."""
    exp = read_json(os.path.join(run_dir, "experiment.json"), {}) or {}
    pid = read_json(os.path.join(run_dir, "pid.json"), {}) or {}
    ended = read_json(os.path.join(run_dir, "exit.json"))
    stop_req = os.path.exists(os.path.join(run_dir, "stop_requested"))
    log = os.path.join(run_dir, LOG)
    try:
        st = os.stat(log)
        log_size, log_mtime = st.st_size, st.st_mtime
    except OSError:
        log_size, log_mtime = 0, None
    key = parse_run_key(os.path.basename(run_dir)) or (None, exp.get("id"))
    out = {"id": key[1], "registry": key[0], "clone": exp.get("clone"), "project": exp.get("project"),
           "exit_code": None, "started": pid.get("started"),
           "ended": None, "log_size": log_size, "log_mtime": log_mtime, "checkpoints": exp.get("checkpoints"),
           "gpus": exp.get("gpus")}
    tried = recorded.attempts(run_dir)
    out.update(tried)
    nodes = exp.get("nodes")
    if isinstance(nodes, list) and len(nodes) > 1:  # a node of a job: a launch that would stop it alone refuses
        out["job"] = {"nodes": [{k: n.get(k) for k in JOB_NODE_KEYS} for n in nodes if isinstance(n, dict)]}
    told = notices.summary(run_dir)  # the webhook's failures are shown, never its URL
    if told is not None:
        out["notify"] = told
    watched = guard_state.summary(run_dir)  # a guarded run: where its guard stands
    if watched is not None:
        out["guard"] = watched
    heard = recorded.job_state(run_dir)  # a node of a job: what its stall watchdog heard from its peers
    if heard is not None:
        out["heartbeat"] = heard
    if stop_req:
        out["stopped_by"] = (read_json(os.path.join(run_dir, "stop_requested"), {}) or {}).get("by")
    job = slurm.job_of(run_dir)
    if job is not None and isinstance(ended, dict) and not stop_req and slurm.requeued(job, ended):
        ended = None  # Slurm requeued its job (preempted, a node failed, scontrol requeue): it comes back
    elif job is not None and isinstance(ended, dict):
        slurm.settled(run_dir, job, ended)  # ended for good: its secrets, kept for a requeue, go
    if isinstance(ended, dict) and ended.get("not_started"):  # the start failed, or a stop came first: it never ran
        out.update(state="stopped" if stop_req else "failed", ended=ended.get("ended"), error=ended.get("error"))
    elif isinstance(ended, dict):
        code = ended.get("exit_code")
        out.update(exit_code=code, ended=ended.get("ended"), signal=ended.get("signal"), cause=ended.get("cause"))
        out["state"] = "stopped" if stop_req else ("finished" if code == 0 else "crashed")
        spent = budget.spent(run_dir)
        if spent is not None and not stop_req:  # ended gracefully at its budget, whatever its exit code
            out.update(state="finished", budget=spent, cause=f"reached its budget of {spent.get('spent')}")
    elif job is not None:  # its supervisor runs on a compute node: Slurm says
        out.update(slurm.state(job, pid, stop_req, run_dir=run_dir))
    elif _alive(pid.get("supervisor"), pid.get("supervisor_start")) or \
            _alive(pid.get("child"), pid.get("child_start")):
        out["state"] = "running"  # a supervisor still alive is about to record the exit code, or to restart
        if tried.get("waiting_until") and not _alive(pid.get("child"), pid.get("child_start")):
            out["phase"] = "restarting"
    elif pid:  # supervisor and command gone without an exit: killed, or the container shut down or restarted
        out["state"] = "stopped" if stop_req else "lost"
        out["lost"] = True
        gone = pid.get("interrupted") or {}  # the supervisor saw the shutdown: cause and end time are known
        out["cause"] = gone.get("cause") or _lost_cause(pid)
        out["ended"] = gone.get("time")
    else:
        launched = read_json(os.path.join(run_dir, "launch.json"), {}) or {}
        young = time.time() - float(launched.get("created", 0)) < 30
        out["state"] = "launching" if young else "crashed"
    return out


def _lost_cause(pid: dict) -> str:
    from . import causes

    return causes.lost_cause(pid)


def _runs(layout: Layout, project: str | None = None, ids: list | None = None,
          registry: str | None = None, *, live: bool = False,
          newest: int | None = None) -> list[tuple[float, int, str]]:
    """This project's run folders, oldest first: every clone's, or with ``registry`` that registry's and
    those from before registry keys. ``ids`` are experiment numbers (of any registry: the caller matches).

    A target keeps every run folder, so this costs a stat per folder and, for ``project``, a read of the records
    it keeps: ``live`` passes over runs with an exit record (written once, last, never removed: that run is over),
    and ``newest`` keeps the project's newest N, reading records from the newest folder back until it has them.
    """
    try:
        names = os.listdir(layout.runs)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        key = parse_run_key(name)
        if key is None or (ids is not None and key[1] not in ids) or (registry and key[0] not in (None, registry)):
            continue
        run_dir = os.path.join(layout.runs, name)
        if live and os.path.exists(os.path.join(run_dir, "exit.json")):
            continue
        try:  # written once at the start: the order runs were started in, whichever clone started them
            born = os.stat(os.path.join(run_dir, "experiment.json")).st_mtime
        except OSError:
            born = 0.0
        found.append((born, key[1], run_dir))
    found.sort()
    if project is None:
        return found[-newest:] if newest else found
    mine = []
    for item in reversed(found):
        if newest and len(mine) >= newest:
            break
        if (read_json(os.path.join(item[2], "experiment.json"), {}) or {}).get("project") == project:
            mine.append(item)
    return mine[::-1]


def alive_runs(layout: Layout, project: str | None = None) -> list[dict]:
    return [s for *_, d in _runs(layout, project, live=True)
            if (s := run_state(d))["state"] in ("running", "launching")]


def status(layout: Layout, project: str | None = None, ids: list | None = None, last: int = 20,
           tail: bool = True, registry: str | None = None) -> dict:
    runs = _runs(layout, project, ids, registry, newest=last if ids is None else None)
    out = []
    for *_, run_dir in runs:
        state = run_state(run_dir)
        if tail:
            state["last_line"] = _last_line(os.path.join(run_dir, LOG))
        out.append(state)
    sacct.tell(out, [run_dir for *_, run_dir in runs])  # an ended Slurm job: how Slurm's accounting saw its end
    return {"runs": out, "now": time.time()}


def records(layout: Layout, project: str) -> dict:
    """Every run folder of ``project`` (every clone's): its ``experiment.json`` and its state now, for a
    registry rebuilt from what the target holds (``orch experiments rebuild``)."""
    out = []
    for *_, run_dir in _runs(layout, project):
        exp = read_json(os.path.join(run_dir, "experiment.json"), {}) or {}
        out.append({"folder": os.path.basename(run_dir), "experiment": exp, "state": run_state(run_dir)})
    return {"runs": out}


def _last_line(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 4096))
            lines = fh.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    return lines[-1] if lines else None


def start(layout: Layout, exp_id: int, project: str, revision: str, argv: list, env: dict,
          experiment: dict, batching: dict, agent_path: str, secrets: dict | None = None,
          registry: str | None = None, recovery: dict | None = None, notify: dict | None = None,
          beside: bool = False, launch: dict | None = None, use_standby: bool = True,
          slurm_job: dict | None = None) -> dict:
    """Write the run's files, then start the supervisor in this project's tmux session (``beside``: next to
    the project's live runs, on GPUs none of them was given: checked by ``start_check``/``runqueue`` under the same
    lock, with ``gpu_share``; ``slurm_job``: submitted as a Slurm job instead, see ``slurm.py``). ``launch``: what
    the command that launched it had (``launch_env``: the local target's ``orch`` command sends its own); without
    it, this agent's own, as the target gave it. ``use_standby``
    False (``[run] standby``): tmux starts the supervisor afresh, and no standby is left for the next start."""
    import shlex

    from .. import journal
    from . import handover, heartbeat, launch_env, reboot_unit, standby, tmux, workdir

    secrets = handover.check(secrets or {})
    inherited = launch_env.check(launch) if launch is not None else launch_env.own()
    base = inherited["env"]
    if notify is not None:  # its URL goes with the secrets, through the pipe
        notify = notices.check(notify)
    if (recovery or {}).get("job") is not None:
        try:
            heartbeat.JobSpec.from_dict(recovery["job"])  # type: ignore[index]
        except ValueError as exc:
            raise AgentFailure("input", f"recovery: {exc}", "deploy the job again with this orch") from None
    rev_dir = layout.revision(revision)
    if not os.path.isdir(rev_dir):
        raise AgentFailure("notfound", f"revision {revision} is not on the target", "deploy again to push it")
    busy = alive_runs(layout, project) if slurm_job is None else []  # Slurm is the queue: it runs when it may
    if busy and not beside:
        raise AgentFailure("conflict", f"experiment {busy[0]['id']} of project {project} is still running",
                           "stop it first (orch stop) or use orch restart")
    units = set() if beside else reboot_unit.installed_names()  # most targets have none: no folder is read
    for *_, other in _runs(layout, project) if units else []:
        if reboot_unit.unit_name(other) in units:
            reboot_unit.remove(other)  # a new run replaces the project's lost ones: none comes back at boot
    run_dir = layout.run_dir(exp_id, registry)
    experiment = {**experiment, "registry": registry}
    if os.path.lexists(run_dir) and not journal.only_launch(run_dir):  # the journal of this launch may be there
        other = (read_json(os.path.join(run_dir, "experiment.json"), {}) or {}).get("project")
        raise AgentFailure("safety", f"run folder {run_dir} already exists (project {other})",
                           "give each project its own [paths] root, or remove the stale run folder")
    os.makedirs(run_dir, exist_ok=True)
    try:
        work = workdir.build(layout, run_dir, revision)
    except BaseException as exc:
        try:
            not_started(run_dir, f"its work folder could not be made: {exc}"[:300])
        except OSError:
            pass  # a full disk: the failure itself is what the caller hears
        raise
    batching_file = os.path.join(run_dir, "batching.json")
    run_env = {k: str(v) for k, v in env.items()}
    run_env.update(ORCH_EXPERIMENT_ID=str(exp_id), ORCH_RUN_DIR=run_dir, ORCH_WORK_DIR=work,
                   ORCH_CHECKPOINT_DIR=str(experiment.get("checkpoints", "")),
                   ORCH_BATCHING_FILE=batching_file, ORCH_REVISION=revision, PYTHONUNBUFFERED="1")
    unpacked = agent_path[:-4] + ".d" if agent_path.endswith(".pyz") else agent_path
    lib = unpacked if os.path.isdir(unpacked) else agent_path  # orchestrator.batching for training scripts
    # the user's folders first ([project] env, then the target's own), orch's batching library last
    run_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(env.get("PYTHONPATH", "")), base.get("PYTHONPATH", ""), lib) if p)
    if run_env.get("VIRTUAL_ENV"):  # the run's environment (envs.py): its python first on the PATH
        run_env["PATH"] = os.pathsep.join(p for p in (os.path.join(run_env["VIRTUAL_ENV"], "bin"),
                                                       str(env.get("PATH") or base.get("PATH", ""))) if p)
    if experiment.get("checkpoints"):
        os.makedirs(experiment["checkpoints"], exist_ok=True)
    # on disk together (one wait for the disk), launch.json renamed last: the supervisor reads the others once it is
    # there; the launch record 0600
    write_all([(batching_file, json_bytes(batching), 0o644),
               (os.path.join(run_dir, "experiment.json"), json_bytes(experiment), 0o644),
               launch_env.record(run_dir, inherited, secrets),
               (os.path.join(run_dir, "launch.json"),
                json_bytes({"argv": list(argv), "cwd": work, "revision": revision, "env": run_env,
                            "secrets": sorted(secrets), "created": time.time(), "recovery": recovery or {},
                            "notify": {k: v for k, v in notify.items() if k != "url"} if notify else None}), 0o644)])
    piped = {**secrets, notices.URL_KEY: notify["url"]} if notify else secrets
    if slurm_job is not None:
        try:
            if piped:  # no pipe reaches a batch job: a file per node, taken by its supervisor
                handover.leave(run_dir, piped, int(slurm_job.get("nodes") or 1))
            job = slurm.submit(run_dir, sys.executable, agent_path, slurm_job)
        except BaseException as exc:
            handover.drop(run_dir)
            not_started(run_dir, f"{exc}"[:300])
            raise
        return {"run_dir": run_dir, "slurm": job}
    server = tmux.Server(socket_name(layout))
    name = session_name(project)
    command = shlex.join([sys.executable, agent_path, "supervise", run_dir])
    sender = handover.Sender(run_dir, piped) if piped else None
    try:
        # a window opened in the session (orch attach, then tmux's new-window) sees the run's env first too
        shown = {k: run_env[k] for k in ("VIRTUAL_ENV", "PATH") if run_env.get("VIRTUAL_ENV")}
        # beside a live run: a window in its session; else the standby supervisor, if one waits, which takes the
        # project's session name in the tmux call that kills a session left under it (only ended runs can be left
        # in it: alive_runs() was empty); else tmux starts one
        window = window_command(agent_path, run_dir)
        started = (server.new_window(name, f"exp{exp_id}", work, command, shown) if busy else
                   use_standby and standby.hand_over(server, layout, agent_path, run_dir, name, f"exp{exp_id}", shown,
                                                  _alive, replace=True, window_command=window))
        told = started and not busy  # the standby's tmux call set the session's window command too
        if not started and not busy:
            _kill_session(server, name)  # no standby took the run: a session left under its name goes first
        if not started:
            server.new_session(name, f"exp{exp_id}", work, command, shown)
        if sender is not None:
            sender.wait_taken(run_dir)  # if it never comes, the supervisor records why the run did not start
    except Exception as exc:
        not_started(run_dir, f"tmux could not start it: {exc!r}"[:300])
        raise
    finally:
        if sender is not None:
            sender.close()
    if not told:
        _window_command(server, name, window)
    try:
        if use_standby:
            standby.leave(server, layout, agent_path, _alive)  # the next start's supervisor, imported meanwhile
        else:
            standby.dismiss(server, layout)
    except Exception:  # noqa: BLE001 (the run has started: without a standby the next start is only slower)
        pass
    return {"run_dir": run_dir, "session": name, "socket": socket_name(layout)}


def window_command(agent_path: str, run_dir: str) -> str:
    """What a window the user opens in the run's session (orch attach, then new-window) runs: a shell with the run's
    environment (``launch_env.window``), not the tmux server's; the session's ``default-command``."""
    import shlex

    return shlex.join([sys.executable, agent_path, "window", run_dir])


def _window_command(server, name: str, command: str) -> None:
    """The session's ``default-command`` (``window_command``), asked of tmux without waiting for it."""
    server.later("set-option", "-t", f"={name}:", "default-command", command)


GONE = ("can't find session", "no server running", "error connecting to")  # what tmux says of no such session


def _kill_session(server, name: str) -> None:
    """Kill a session if it exists (one tmux call); it may end by itself meanwhile (its pane's command exited)."""
    from . import tmux

    said = " ".join(server.cmd("kill-session", "-t", f"={name}").stderr)
    if said and not any(words in said for words in GONE) and server.has_session(name):
        raise tmux.TmuxError(said)


BEFORE_START = "stopped before its command started"


def not_started(run_dir: str, why: str) -> None:
    """Record that a run's start failed, so it reads as ``failed`` (``stopped`` when a stop came first: it was marked),
    never ``launching``, never "still running"."""
    if not os.path.exists(os.path.join(run_dir, "exit.json")):
        write_json(os.path.join(run_dir, "exit.json"), {"exit_code": None, "signal": None, "ended": time.time(),
                                                        "error": why, "not_started": True})


def _say(text: str) -> None:
    """A line for whoever watches the run's pane (orch attach). Its terminal may be gone (the session killed as the
    run ended: a stop's kill-session, which comes once the exit is recorded): the line is dropped, and the supervisor
    goes on to what follows the exit (the next queued run), where the write's error used to end it first."""
    try:
        print(text, flush=True)
    except OSError:
        try:
            sys.stdout = open(os.devnull, "w")  # nothing left in a buffer for the exit to write to the dead terminal
        except OSError:
            pass


def import_supervisor() -> None:
    """Import now what ``supervise`` imports as it goes, to the attempt's exit record (what a run's start and a stop
    wait for): a standby (``standby.py``) does, before it waits, so the start it takes and the stop that ends it wait
    for no import (~20 ms of a start on a loaded target). ``tests/agent/test_standby_imports.py`` keeps it whole."""
    import encodings.ascii  # noqa: F401  (procstat reads /proc in ascii)
    import shlex  # noqa: F401
    import signal  # noqa: F401
    import subprocess  # noqa: F401
    import tempfile  # noqa: F401  (write_atomic's, for the pid file)

    from .. import diskspace  # noqa: F401
    from ..ckpt import ckpt_layout  # noqa: F401
    from ..metrics import metric_lines  # noqa: F401  (the series' reader, at the first tick)
    from ..watch import guard  # noqa: F401
    from . import attempts, causes, handover, launch_env, reboot_unit, series, slurm_launch, watchdog  # noqa: F401


def supervise(run_dir: str) -> int:
    """The pane's process: run the command (again, as its restart policy says), log its output, record the end."""
    import shlex
    import signal

    from .. import diskspace
    from ..watch import guard
    from . import attempts, causes, handover, launch_env, reboot_unit, slurm_launch

    top, run_dir = run_dir, slurm.node_folder(run_dir, os.environ)  # a Slurm job's later nodes: a folder each
    if os.path.exists(os.path.join(run_dir, "exit.json")) and not slurm.resumes(run_dir, os.environ, top):
        return 0  # too late: its start was already given up (``not_started``)
    launch = read_json(os.path.join(run_dir, "launch.json"))
    log_path = os.path.join(run_dir, LOG)
    # the launch's variables, umask and limits (never this process's: a standby's, the tmux server's)
    env, missed = launch_env.apply(launch_env.read(run_dir))
    # in a Slurm job: its allocation (SLURM_JOB_ID, the GPUs it was given) and, over several nodes, each one's rank
    env.update(slurm.allocation(os.environ), **slurm.node_env(os.environ))
    wanted = launch.get("secrets") or launch.get("notify")
    # a Slurm job's come in a file per node (no pipe reaches a batch job: its job.sh is there before it is
    # submitted, its slurm.json only once sbatch answered); a tmux start's through the pipe
    batch = os.path.exists(os.path.join(top, slurm.SCRIPT))
    secrets = (handover.take(top, os.environ) if batch else handover.receive(run_dir)) if wanted else {}
    url = (secrets or {}).pop(notices.URL_KEY, None)
    if secrets is None and not launch.get("secrets"):
        secrets = {}  # only the webhook's URL was to come (a resume after a reboot): the run goes without it
    env.update(secrets or {})
    told = notices.Notifier(run_dir, launch.get("notify"), url)
    if launch.get("notify") and not url:
        notices.log_result(run_dir, "start", {"ok": False, "status": None, "tries": 0,
                                              "error": "no webhook URL came with this start (it is never stored "
                                                       "on the target, so a resume after a reboot has none)"})
    env.update(launch["env"])
    launch, launched = slurm_launch.launch(top, launch, env, os.environ)  # a Slurm job's nodes: torchrun's line
    policy = attempts.Policy.from_dict(launch.get("recovery"))
    history = attempts.History(run_dir, policy)
    spec = guard.Spec.from_dict(policy.extra.get("guard"))
    guarded = guard.Watch(spec, run_dir) if spec is not None else None
    _say(f"orch: experiment run in {run_dir}\norch: {shlex.join(launch['argv'])}")
    with open(log_path, "ab", buffering=0) as raw:
        log = diskspace.SparedLog(raw)
        if secrets is None:
            why = "its secrets did not arrive from the agent"
            log.write(f"orch: not started: {why} ({', '.join(launch['secrets'])})\n".encode())
            return _record_exit(run_dir, 127, None, error=why)
        if launched:
            log.write(launched.encode())
        if missed:
            log.write(f"orch: the launch's hard limits of {', '.join(missed)} are above the supervisor's, which the "
                      "run keeps\n".encode())
        if launch.get("secrets"):
            log.write(f"orch: secrets in the environment: {', '.join(launch['secrets'])}\n".encode())
        stopping: list = []  # a SIGINT/SIGTERM/SIGHUP to the supervisor: the run is being stopped
        children: list = []

        def forward(signum: int, _frame: object) -> None:
            stopping.append(signum)
            if children and not launch.get("step_signalled"):
                try:
                    os.killpg(children[-1].pid, signum)
                except ProcessLookupError:
                    pass

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, forward)
        if attempts.stop_requested(run_dir):  # a stop came while it was launching: it is never started
            log.write(f"orch: {BEFORE_START}\n".encode())
            not_started(run_dir, BEFORE_START)
            return 0
        _reserve_exit(run_dir)
        resumes = policy.resume_after_reboot
        # a boot inside the guard's window fails the guard and rolls back (``rollback.at_boot``), no orch needed
        watching = guarded is not None and guarded.open and guarded.spec.on_fail == "rollback"
        if resumes or watching:
            why = reboot_unit.install(run_dir, sys.executable, os.path.abspath(sys.argv[0]))
            if resumes:
                log.write(f"[orch] resume_after_reboot: {why}; a reboot leaves this run lost\n".encode()
                          if why else b"")
            elif not why and guarded is not None:  # the unit was for the window alone
                guarded.on_pass = lambda: reboot_unit.remove(run_dir)
            resumes = resumes and not why
        while True:
            ended = _attempt(run_dir, launch, env, log, policy, history, stopping, children, told, guarded)
            if isinstance(ended, int):
                told.send("crashed", exit_code=ended, reason=history.items[-1].get("reason"),
                          last_lines=notices.last_lines(log_path))
                return ended  # the command could not be started
            code, sig, reason = ended
            if reason in causes.SHUTDOWN:
                return _interrupted(run_dir, reason, log, resumes, code, guarded)
            if not policy.restart_after(len(history.items) - 1, code, reason, history.lost):
                break
            pause = policy.delay(len(history.items))
            history.waiting(time.time() + pause)
            told.send("restarted", exit_code=code, signal=sig, reason=reason, attempt=len(history.items) + 1,
                      attempts=policy.attempts + history.lost, delay=pause)
            if not attempts.wait_backoff(run_dir, pause, stopping):
                if _going_down(run_dir, stopping, 0):  # the shutdown came during the backoff
                    return _interrupted(run_dir, causes.shutdown_cause(), log, resumes, code, guarded)
                break
    cause = causes.hangup_cause(stopping, run_dir)
    if cause is None and sig == signal.SIGKILL and not stopping and not attempts.stop_requested(run_dir):
        pid = read_json(os.path.join(run_dir, "pid.json"), {}) or {}  # no stop sent it: the OOM killer?
        cause = causes.oom_cause(pid.get("child"), pid.get("child_comm"))
    if guarded is not None:  # the verdict before the exit: whoever reads the end reads the guard's too
        guarded.ended(code, history.items[-1].get("reason") or "", attempts.stop_requested(run_dir))
    _record_exit(run_dir, code, sig, cause=cause)
    if stopping and not attempts.stop_requested(run_dir) and slurm.resubmit(run_dir, os.environ):
        with open(log_path, "ab") as tail:  # said in the run's log, where orch logs shows it
            tail.write(b"orch: the time limit's signal ended it: requeued, to go on in a new allocation\n")
        return code  # its next attempt is the requeued job's (``slurm.resumes``), so nothing is told yet
    if not stopping and not attempts.stop_requested(run_dir):
        told.send("finished" if code == 0 else "crashed", exit_code=code, signal=sig, reason=reason, cause=cause,
                  attempts=len(history.items), last_lines=[] if code == 0 else notices.last_lines(log_path))
    _say(f"orch: exited with code {code}")
    if guarded is not None:
        guarded.after_exit(os.path.abspath(sys.argv[0]))
    return code


def _attempt(run_dir: str, launch: dict, env: dict, log, policy: attempts.Policy, history: attempts.History,
             stopping: list, children: list, told: notices.Notifier,
             guarded: guard.Watch | None = None) -> tuple[int, int | None, str] | int:
    """One attempt: mark it in the log, start the command, watch it; (code, signal, reason), or 127 if not started."""
    import signal
    import subprocess

    from ..ckpt import ckpt_layout
    from ..watch import guard
    from . import attempts, causes, watchdog

    attempt = len(history.items)
    folder = launch["env"].get("ORCH_CHECKPOINT_DIR", "")
    others = ckpt_layout.legacy_names(Layout(os.path.dirname(os.path.dirname(run_dir))), os.path.normpath(folder)) \
        if folder else frozenset()  # its own lineage's newest, never a variant's folder an older orch nested there
    resume_from = attempts.newest_checkpoint(folder, policy.checkpoint_glob, others)
    log.write(attempts.marker(attempt, history.data["max"], history.items[-1] if history.items else None,
                              resume_from).encode())
    env.pop("ORCH_RESUME", None)
    env.update(attempts.attempt_env(attempt, resume_from))
    history.begin(resume_from)
    metrics = notices.MetricWatch(told, os.path.join(run_dir, LOG)) if told.wants("spike") or told.wants("slow") \
        else None  # from this attempt's first line
    try:
        child = subprocess.Popen(launch["argv"], cwd=launch["cwd"], env=env, stdout=log,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as exc:
        log.write(f"orch: cannot start {launch['argv'][0]!r}: {exc.strerror}\n".encode())
        history.end(127, f"cannot start: {exc.strerror}")
        return _record_exit(run_dir, 127, None, error=exc.strerror)
    children.append(child)
    _write_pid(run_dir, child)
    if not stopping and (read_json(os.path.join(run_dir, "exit.json"), {}) or {}).get("not_started"):
        stopping.append(signal.SIGINT)  # a stop gave up waiting for it between its supervisor's check and here
        os.killpg(child.pid, signal.SIGINT)
    limit = budget.Budget.from_env(launch["env"], run_dir)
    kept = _Kept(run_dir)
    rc, stalled = watchdog.watch(child, run_dir, policy, stopping, log, kept.tick if metrics is None else
                                 lambda: (kept.tick(), metrics.tick()), limit, guarded)
    kept.tick(final=True)
    if metrics is not None:
        metrics.tick()  # the lines written since the last tick
    code, sig = (rc, None) if rc >= 0 else (128 - rc, -rc)
    if _going_down(run_dir, stopping, code):
        reason = causes.shutdown_cause()
    elif limit is not None and budget.spent(run_dir) is not None and not attempts.stop_requested(run_dir):
        reason = "budget"
    elif stopping or attempts.stop_requested(run_dir):
        reason = "stopped"
    else:
        reason = attempts.reason_for(code, sig, stalled)
    history.end(code, reason)
    if stalled:
        log.write(watchdog.stall_note(policy).encode())
        told.send("stalled", stall_after=policy.stall_timeout, attempt=attempt + 1, exit_code=code,
                  last_lines=notices.last_lines(os.path.join(run_dir, LOG)))
    return code, sig, reason


class _Kept:
    """The run's metric series (``series.py``) as the watch's ticks append to it; a file it cannot write (a full
    disk) ends the keeping, never the run."""

    def __init__(self, run_dir: str) -> None:
        from . import series

        self.series: series.Series | None = None
        try:
            self.series = series.Series(run_dir)
        except OSError:
            pass

    def tick(self, final: bool = False) -> None:
        if self.series is None:
            return
        try:
            self.series.tick(final)
        except OSError:
            self.series = None


def _going_down(run_dir: str, stopping: list, code: int) -> bool:
    """Whether the attempt (or the backoff) ended because the system is going down: a signal to the
    supervisor, or the command's own failure (it may have got the SIGTERM first), with no ``orch stop``."""
    from . import attempts, causes

    if attempts.stop_requested(run_dir) or not (stopping or code != 0):
        return False
    return causes.shutting_down()


def _interrupted(run_dir: str, cause: str, log, resumes: bool, code: int, guarded: guard.Watch | None = None) -> int:
    """The system is going down under the run: no exit is recorded and the reboot unit stays, so the run
    reads as lost (``cause``, at this time) until the attempt after boot, which resumes from the newest
    checkpoint (inside a guard's window: its guard fails then, and the rollback puts the parent back)."""
    from ..watch import guard

    path = os.path.join(run_dir, "pid.json")
    write_json(path, (read_json(path, {}) or {}) | {"interrupted": {"cause": cause, "time": time.time()}})
    after = "it resumes at the next boot" if resumes else "orch restart resumes it from its newest checkpoint"
    if guarded is not None and guarded.open:
        after = "its guard fails at the next boot or orch call" + (
            f", and the rollback puts experiment {guarded.spec.parent.get('id')} back"
            if guarded.spec.on_fail == "rollback" else "")
    log.write(f"[orch] {cause}: {after}\n".encode())
    return code


def _write_pid(run_dir: str, child: subprocess.Popen) -> None:
    """The supervisor and the current attempt's process; ``started`` stays the first attempt's start."""
    import subprocess

    from . import causes

    path = os.path.join(run_dir, "pid.json")
    first = (read_json(path, {}) or {}).get("started")
    write_json(path, {"supervisor": os.getpid(), "supervisor_start": _proc_start(os.getpid()), "child": child.pid,
                      "child_start": _proc_start(child.pid), "child_comm": causes.comm(child.pid),
                      "started": first or time.time(),
                      "boot_id": causes.boot_id()})


EXIT_RESERVE = ".exit-reserve"  # space for the exit record, taken before the command starts
RESERVE_BYTES = 4096


def _reserve_exit(run_dir: str) -> None:
    """Take the exit record's space while there is some: a command that ends on a full disk still reads as
    finished or crashed, with its code, not as lost."""
    try:
        with open(os.path.join(run_dir, EXIT_RESERVE), "wb") as fh:  # a write reserves its blocks: no fsync
            fh.write(b" " * RESERVE_BYTES)
    except OSError:
        pass  # already full: the exit is recorded if space comes back


def _record_exit(run_dir: str, code: int, sig: int | None, error: str | None = None,
                 cause: str | None = None) -> int:
    from .. import diskspace
    from . import reboot_unit

    reboot_unit.remove(run_dir)  # the run is over: nothing to resume at the next boot
    record = {"exit_code": code, "signal": sig, "ended": time.time()} | ({"cause": cause} if cause else {})
    data = (json.dumps(record | ({"error": error} if error else {}), indent=2, sort_keys=True) + "\n").encode()
    path, reserve = os.path.join(run_dir, "exit.json"), os.path.join(run_dir, EXIT_RESERVE)
    try:
        write_atomic(path, data)
    except OSError as exc:
        if exc.errno not in diskspace.FULL or len(data) > RESERVE_BYTES or not os.path.exists(reserve):
            raise
        with open(reserve, "r+b") as fh:  # its blocks are allocated: overwriting them takes no new space
            fh.write(data)
            fh.truncate(len(data))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(reserve, path)
        return code
    try:
        os.unlink(reserve)
    except FileNotFoundError:
        pass
    return code


def resume(run_dir: str) -> int:
    """After a reboot (the run's systemd unit): start the supervisor of a ``lost`` run again, as a new attempt."""
    import shlex

    from ..watch import guard
    from . import reboot_unit, tmux

    run_dir = os.path.normpath(run_dir)
    state = run_state(run_dir)
    launch = read_json(os.path.join(run_dir, "launch.json"), {}) or {}
    if state["state"] == "lost" and (guard.summary(run_dir) or {}).get("state") == "watching":
        guard.fail_lost(run_dir, state.get("cause"))  # lost inside its guard's window: it fails as a crash's would
    why = None
    if state["state"] != "lost":
        why = f"it is {state['state']}"
    elif (watched := guard.summary(run_dir) or {}).get("state") in ("failed", "rolled back", "rollback failed",
                                                                    "stopped on failure"):
        why = "its guard failed" + (": the rollback puts its parent back instead"
                                    if watched.get("on_fail", "rollback") == "rollback" else "")
    elif launch.get("secrets"):
        why = "its secrets are never stored on the target"
    elif watched and not (launch.get("recovery") or {}).get("resume_after_reboot"):
        why = "[run] resume_after_reboot is off (its unit was there for its guard's window)"
    if why:
        reboot_unit.remove(run_dir)
        print(f"orch: not resuming {run_dir}: {why}", flush=True)
        return 0
    layout = Layout(os.path.dirname(os.path.dirname(run_dir)))
    server = tmux.Server(socket_name(layout))
    name = session_name(str(state["project"]))
    command = shlex.join([sys.executable, os.path.abspath(sys.argv[0]), "supervise", run_dir])
    cwd = launch.get("cwd") or layout.root
    if alive_runs(layout, str(state["project"])) and server.new_window(name, f"exp{state['id']}", cwd,
                                                                           command):
        return 0  # runs side by side: another resumed first, in this session
    _kill_session(server, name)
    server.new_session(name, f"exp{state['id']}", cwd, command)
    _window_command(server, name, window_command(os.path.abspath(sys.argv[0]), run_dir))
    return 0


def _mark_stopping(run_dir: str, by: dict | None = None) -> None:
    """The marker that makes a stopped run read as ``stopped``, and says who stopped it (``by``: the experiment
    and registry of the launch, or none for ``orch stop``, and the clone); on a full disk, an empty file."""
    marker = os.path.join(run_dir, "stop_requested")
    try:
        write_json(marker, {"time": time.time(), "by": by})
    except OSError:
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT, 0o644))


def _wait(run_dir: str, seconds: float, pid: int | None = None) -> bool:
    """Wait for the run to end; with ``pid`` (the signalled process) only its own time counts (``grace``)."""
    from . import grace

    clock = grace.Grace(seconds, pid) if pid else None
    begin = time.monotonic()
    deadline = begin + seconds
    while True:
        if run_state(run_dir)["state"] not in ("running", "launching"):
            return True
        if clock.tick() if clock is not None else time.monotonic() >= deadline:
            return False
        nap = min(POLL_S, max(deadline - time.monotonic(), 0.0))
        if time.monotonic() - begin < QUICK_S:
            _until_exists(os.path.join(run_dir, "exit.json"), nap)
        else:
            time.sleep(nap)


QUICK_S = 0.5  # the start of a wait, when a signalled command usually ends: its exit record is looked for often
QUICK_POLL_S = 0.001


def _until_exists(path: str, seconds: float) -> None:
    """Sleep up to ``seconds``, waking within a millisecond of ``path`` appearing (a stat each time: cheap)."""
    end = time.monotonic() + seconds
    while not os.path.exists(path):
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(QUICK_POLL_S, left))


def stop(layout: Layout, project: str | None, ids: list | None, stop_timeout: float, term_timeout: float,
         term_first: bool = False, by: dict | None = None, registry: str | None = None,
         keep_session: bool = False) -> dict:
    """SIGINT, wait; SIGTERM, wait; SIGKILL. Each stopped run is marked so it reads as ``stopped``.

    ``term_first`` starts at SIGTERM: what torchrun's launcher takes as "stop the job" on every node.
    ``registry`` keeps ``ids`` to that registry's runs (another clone's experiment 5 is not ours).
    ``keep_session``: the project's tmux session is left to the start that comes next in the same call, which
    replaces it (a session whose runs all ended is otherwise killed here).
    """
    import signal

    from . import reboot_unit, tmux

    targets = [run_state(d) | {"dir": d} for *_, d in _runs(layout, project, ids, registry, live=True)]
    stopped = []
    for state in targets:
        reboot_unit.remove(state["dir"])  # a stopped (or lost) run is never resumed at the next boot
        if state["state"] not in ("running", "launching") and not (state.get("slurm") and state["state"] == "queued"):
            continue
        run_dir = state["dir"]
        _mark_stopping(run_dir, by)
        if state.get("slurm"):  # a Slurm job: its supervisors run on the compute nodes
            sent = slurm.stop(run_dir, slurm.job_of(run_dir) or state["slurm"], stop_timeout, term_timeout,
                              running=state["state"] == "running")
            if not sent:
                not_started(run_dir, BEFORE_START)
            final = run_state(run_dir)
            stopped.append({"id": final["id"], "registry": final["registry"], "clone": final["clone"],
                            "state": final["state"], "exit_code": final["exit_code"], "signals": sent,
                            "ended": final.get("ended")})
            continue
        pid = read_json(os.path.join(run_dir, "pid.json"), {}) or {}
        sent = []
        ladder = ((signal.SIGINT, stop_timeout), (signal.SIGTERM, term_timeout), (signal.SIGKILL, 5.0))
        for sig, wait in ladder[1:] if term_first else ladder:
            if not pid.get("child"):
                _wait(run_dir, 2.0)
                pid = read_json(os.path.join(run_dir, "pid.json"), {}) or {}
                if not pid.get("child"):
                    break
            try:
                os.killpg(int(pid["child"]), sig)
                sent.append(signal.Signals(sig).name)
            except ProcessLookupError:
                pass
            if _wait(run_dir, wait, int(pid["child"])):
                break
        if not pid.get("child"):  # stopped while launching: its supervisor, if it comes, must not start it
            not_started(run_dir, BEFORE_START)
        final = run_state(run_dir)
        stopped.append({"id": final["id"], "registry": final["registry"], "clone": final["clone"],
                        "state": final["state"], "exit_code": final["exit_code"], "signals": sent,
                        "ended": final.get("ended")})
    if project is not None and not keep_session and not alive_runs(layout, project):
        _kill_session(tmux.Server(socket_name(layout)), session_name(project))
    return {"stopped": stopped}


def verify_started(layout: Layout, exp_id: int, wait: float = 1.0, registry: str | None = None) -> dict:
    """Wait for the supervisor's pid file (written the moment the command is spawned), then until the
    command has lived ``wait`` seconds: one that exits at once is reported crashed, never started.

    The window counts from the command's start (the pid file's time), not from when this call saw the
    file, so the supervisor's own start-up is not added to it; an exit ends it at once.
    """
    run_dir = layout.run_dir(exp_id, registry)
    if slurm.job_of(run_dir) is not None:  # Slurm starts it when its nodes are free: pending, or running
        return run_state(run_dir)
    pid_path = os.path.join(run_dir, "pid.json")
    deadline = time.monotonic() + 30.0  # generous: a loaded machine can be slow to start Python
    while True:
        try:
            spawned = os.stat(pid_path).st_mtime
            break
        except FileNotFoundError:
            pass
        if os.path.exists(os.path.join(run_dir, "exit.json")):  # the command could not be started
            return run_state(run_dir)
        if time.monotonic() >= deadline:
            not_started(run_dir, "its supervisor did not come up within 30 s")
            raise AgentFailure("agent", f"experiment {exp_id} did not start within 30 s",
                               "check that tmux works on the target: orch status shows the run's state")
        time.sleep(POLL_S)
    lived = min(max(time.time() - spawned, 0.0), wait)  # clamped: a clock step must not skip or stretch it
    _wait(run_dir, wait - lived)
    return run_state(run_dir)
