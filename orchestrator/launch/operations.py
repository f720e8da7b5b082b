"""Running a playbook against a target: two agent calls (three with a push), recorded in the registry.

Execution has two phases so that nothing changes before everything has been checked:

1. **probe** (one unlocked agent call): preflight, which blobs the target lacks, what runs, what the
   checkpoint folder holds. Then, locally: confirmation; the blobs the target lacks are streamed
   (``push``, unlocked: storing them changes nothing visible); the experiment row (``launching``).
2. **apply** (one agent call holding the target's lock, its ops from the plan's actions by
   ``locked_ops``, which a job's nodes use too): assemble the revision, check the checkpoint folder is
   safe and that the new run can start (``run_check``), stop the old run, move checkpoints, shell
   steps, start, verify.

If phase 2 fails the new experiment is marked ``failed`` with the error, never left ``launching``; if it
failed at the start, after the old run was stopped, the checkpoints it moved are put back (``way_back``).
If it is interrupted (Ctrl-C, SIGTERM, SIGHUP, a dropped link), the agent finishes the step in progress
and stops at the next one, unless the old run is already stopped: then the new run's start goes on to its
end, so that one of them runs. orch then asks the target what was done, records that, and says it in one
line (``Interrupted``), with the command that puts the old run back (``orch restart -e 9``). If orch itself
is killed (SIGKILL), the row's launch lock (``launch_guard``) is dropped by the kernel and the next command
that reaches the target settles it (``status.reconcile``).
With ``wait`` the run is watched until its first metric line, its end, or the time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from . import guarded, result as launch_result, scheduler, way_back
from .. import checkpoints, signals
from ..reach.agent_client import AgentClient, Op
from ..config import Settings
from ..errors import Interrupted, OrchError, TransportError
from ..records.experiments import Experiment, Registry, clone
from ..records.launch_guard import LaunchGuard
from ..watch import doctor
from .model import (BuildEnv, Checkpoints, Doctor, Launch, Outcome, Preflight, PushRevision, QueueRun, Record, Shell,
                    StartRun, StopRun, VerifyStarted, checkpoint_action)
from ..records.reconcile import reconcile
from ..reach.targets import Target


def _experiment_json(exp: Experiment) -> dict:
    return {k: v for k, v in exp.public().items() if k not in ("config",)} | {"project": exp.project}


def execute(launch: Launch, registry: Registry) -> Outcome:
    with signals.as_interrupts():  # SIGTERM, SIGHUP: recorded like Ctrl-C, not left "launching"
        return _execute(launch, registry)


def _execute(launch: Launch, registry: Registry) -> Outcome:
    target, settings = launch.target, launch.settings
    project = settings.project.name
    out = Outcome()
    assert target.connect is not None
    if launch.has(Record):
        registry.require_writable()  # a launch that cannot be recorded changes nothing
    transport = target.connect()
    guard = LaunchGuard(registry.path.parent)
    try:
        client = AgentClient(transport, target.root, target.python, timeout=settings.ssh.command_timeout)
        try:
            # every unsettled row of this registry on the target (launches an earlier orch left behind too),
            # in the probe's call
            probe = _probe(launch, client, project, registry)
        except KeyboardInterrupt as exc:
            how, code = signals.describe(exc)
            raise Interrupted(f"{how}: nothing was changed on the target", exit_code=code) from None
        doctor.refuse(probe.get("findings"), target.label, launch.echo)  # a failed check: nothing was changed
        if launch.has(StopRun) and launch.has(StartRun):  # never one node of a job stopped alone
            from . import spare_jobs

            spare_jobs.check({target.machine: probe["alive_runs"]}, {target.machine: target.label},
                             registry.registry_id, launch.book.name)
        parent = guarded.check(launch, probe, registry) if launch.guard else None  # refused before anything changes
        action = checkpoint_action(launch.actions)
        writer = _writer(probe, settings)
        if action != "keep":
            checkpoints.confirm_launch(probe["inventory"], action, target.label, writer, yes=launch.yes,
                                       confirm=launch.confirm, echo=launch.echo, guard=launch.guard)
        elif launch.has(StartRun) and not (launch.beside or launch.sweep):  # those get a folder of their own
            _notice_checkpoints(launch, probe.get("inventory"), writer)
        _push(launch, client, probe, out)
        build_env(launch, client, probe)
        exp = None
        try:
            if launch.has(Record):
                # numbered by this registry alone: its runs' folders on the target carry its id (runs/<id>-<n>)
                exp = registry.create(launcher=guard, **_record_fields(launch, probe))
                if (launch.sweep or launch.beside) and not launch.in_folder:  # side by side: never each other's
                    exp = registry.update(exp.id, checkpoints=checkpoints.variant_folder(
                        target, probe.get("inventory"), exp.id))
                out.experiment = exp
                if parent is not None:
                    out.guard = guarded.spec(launch, registry, exp, parent)
            results = _apply(launch, client, registry, probe, exp, out, writer)
        except (KeyboardInterrupt, TransportError) as exc:
            transport.close()
            how, code = (launch_result.DROPPED, 0) if isinstance(exc, TransportError) else signals.describe(exc)
            truth = launch_result.settle_interrupted(launch, registry, probe, exp, out, how)
            if isinstance(exc, TransportError):
                raise TransportError(f"{exc.message}; {truth}", hint=exc.hint) from None
            raise Interrupted(f"{how}: {truth}", exit_code=code) from None
        except BaseException as exc:
            if exp is not None:
                moved = checkpoints.record(out.checkpoints)  # the trash op ran before the failure
                moved.update(out.undo)
                registry.update(exp.id, status="failed", ended=time.time(), error=str(exc)[:2000], **moved)
                out.experiment = registry.get(exp.id)
            raise
        with registry.batch():  # the stopped runs and the new one's state: one transaction
            _record_results(launch, registry, results, out)
            if "known" in probe:
                from ..records import unknown_runs

                out.settled = unknown_runs.settle(registry, target, project, launch.stop_ids or [],
                                                  probe["known"]["runs"], out.stopped)
        guard.release()
        if launch.wait and out.experiment is not None and out.experiment.status == "running":
            try:
                out.waited = launch_result.wait_first_metric(launch, client, out.experiment,
                                                             registry.run_registry(out.experiment.id))
                launch_result.record_wait(registry, out)
                if out.guard is not None:  # and the guard's verdict: a rollback exits 1
                    out.verdict = guarded.wait_verdict(launch, client, registry, out.experiment)
                    out.experiment = registry.get(out.experiment.id)
            except KeyboardInterrupt as exc:
                how, code = signals.describe(exc)
                raise Interrupted(f"{how} while waiting: experiment {out.experiment.id} was started on "
                                  f"{target.label} and goes on (orch status, orch logs --follow)",
                                  exit_code=code) from None
        out.stats = {"agent_calls": client.calls, "agent_pushes": client.pushes,
                     "connections": transport.stats.connections, "commands": transport.stats.commands,
                     "bytes_sent": transport.stats.bytes_sent, "agent_ms": client.timings}
        return out
    finally:
        guard.release()
        transport.close()


def _push(launch: Launch, client: AgentClient, probe: dict, out: Outcome) -> None:
    """Send the blobs the target lacks, before the lock is taken: storing them changes nothing visible."""
    from . import push

    if launch.revision is None or not launch.has(PushRevision):
        return
    if launch.has(Record) and not (launch.has(BuildEnv) and launch.inputs.env is not None):
        small = push.inline(launch.revision, probe.get("missing") or {})
        if small is not None:  # stored first in the locked call (_apply), before anything there changes
            probe["inline_push"], out.pushed = small[:2], small[2]
            return
    try:
        found = push.resolve(client, launch.revision, probe.get("missing") or {}, launch.progress)
        out.pushed = push.send(client, launch.revision, found, meter=launch.progress,
                               stall=launch.settings.ssh.command_timeout)
        push.bind(launch)  # a pending revision's id is known now that it is hashed
    except KeyboardInterrupt as exc:
        how, code = signals.describe(exc)
        raise Interrupted(f"{how} during the push: nothing was changed on the target; what was sent is kept, "
                          "and the next deploy sends only the rest", exit_code=code) from None
    except TransportError as exc:
        raise TransportError(f"{exc.message}; nothing was changed on the target, and what was sent is kept",
                             hint="deploy again: only what is still missing is sent") from None


def build_env(launch: Launch, client: AgentClient, probe: dict) -> None:
    """The run's environment, built unless the target has it, before the lock is taken and anything stops: a
    build that fails leaves the running experiment as it was (and a cut one is never used: ``agent/store/envs``)."""
    from . import envs

    if not launch.has(BuildEnv):
        return
    try:
        envs.prepare(launch, client, probe)
    except KeyboardInterrupt as exc:
        how, code = signals.describe(exc)
        raise Interrupted(f"{how} while the environment was built: nothing was changed on the target (a half-built "
                          "environment is never used; the next deploy builds it)", exit_code=code) from None
    except TransportError as exc:
        raise TransportError(f"{exc.message}; nothing was changed on the target (a half-built environment is never "
                             "used)", hint="deploy again: the environment is built then") from None


def preview(launch: Launch) -> dict:
    """What a launch would do, from the read-only probe: runs it would stop, checkpoints, bytes to send."""
    target = launch.target
    assert target.connect is not None
    transport = target.connect()
    try:
        client = AgentClient(transport, target.root, target.python, timeout=launch.settings.ssh.command_timeout)
        probe = _probe(launch, client, launch.settings.project.name)
    finally:
        transport.close()
    from . import push

    send = None
    if launch.revision is not None:
        found = probe.get("missing") or {}
        entries = push.plan(launch.revision, found.get("missing", []), found.get("partial") or {})
        send = {"files": len(entries), "bytes": sum(e["size"] - e["offset"] for e in entries)}
    env = None
    if "env" in probe and launch.inputs.env is not None:
        from .envs import env_hash

        name = env_hash(launch.inputs.env, probe["env"])
        env = {"hash": name, "there": name in (probe["env"].get("envs") or {})}
    return {"stop": _stopping(launch, probe),
            "checkpoints": probe.get("inventory"), "writer": _writer(probe, launch.settings), "send": send,
            "env": env, "doctor": [f.to_dict() for f in probe["findings"]] if "findings" in probe else None}


def _stopping(launch: Launch, probe: dict) -> list:
    """The live runs a launch's stop step would stop: every one of the project's, or those of ``stop_ids``."""
    if not launch.has(StopRun):
        return []
    if launch.stop_ids is None:
        return probe["alive"]
    return [i for i in probe["alive"] if i in launch.stop_ids]


def _writer(probe: dict, settings: Settings) -> checkpoints.Writer | None:
    return checkpoints.writer(probe["status"]["runs"], probe.get("inventory"), clone(settings))


def _notice_checkpoints(launch: Launch, inv: dict | None, writer: checkpoints.Writer | None) -> None:
    said = checkpoints.notice(inv, writer)
    if said:
        launch.echo(said)


def _probe(launch: Launch, client: AgentClient, project: str, registry: Registry | None = None,
           also: tuple[tuple[str, Op], ...] = (), store: tuple[Op, bytes] | None = None) -> dict:
    """What the launch needs to know of the target, in one call; ``also``: more ops of that call, by key;
    ``store``: blobs stored first (``push.changed_ahead``), so that what the call finds missing is what is left."""
    target = launch.target
    ops: list[Op] = []
    keys: list[str] = []
    for step in launch.actions:
        if isinstance(step, Preflight) and "preflight" not in keys:
            ops.append(Op("preflight", {"min_free_mb": step.min_free_mb}))
            keys.append("preflight")
    if launch.has(BuildEnv) and launch.inputs.env is not None:  # the interpreter's facts and the envs built
        from .envs import probe_op

        ops.append(probe_op(launch.inputs.env))
        keys.append("env")
    if launch.has(PushRevision) and launch.revision is not None and launch.revision.files:
        from .push import missing_op

        if store is not None:
            ops.append(store[0])
            keys.append("stored")
        ops.append(missing_op(launch.revision))
        keys.append("missing")
    if launch.has(Doctor):
        ops.append(doctor.agent_op(target))
        keys.append("doctor")
    ops.append(Op("status", {"project": project, "tail": False, "gpus": False}))  # preflight reports GPUs
    keys.append("status")
    if launch.has(StopRun) and launch.stop_ids and not launch.has(StartRun) and registry is not None:
        # stop -e N: whether the target knows N at all (a row it does not know is settled, not left running)
        ops.append(Op("status", {"project": project, "ids": list(launch.stop_ids), "tail": False, "gpus": False,
                                 "registry": registry.registry_id}))
        keys.append("known")
    action = checkpoint_action(launch.actions)
    if launch.has(StartRun) or action != "keep":
        ops += checkpoints.probe_ops(target, launch.settings, action)
        keys += ["ckpt_safe", "inventory"]
    for key, op in also:
        ops.append(op)
        keys.append(key)
    sent = time.time()
    if registry is not None:
        values = reconcile(launch.settings, target, registry, client, also=ops)
    else:
        values = client.call(ops, what=f"{launch.book.name} (probe)",
                             payload=store[1] if store is not None and "stored" in keys else b"")
    probe = dict(zip(keys, values))
    if "doctor" in probe:
        least = next((a.min_free_mb for a in launch.actions if isinstance(a, Preflight)), 0)
        probe["findings"] = doctor.findings(target, probe["doctor"], doctor.ask_node(client.transport, target),
                                            sent, time.time(), min_free_mb=least)
    probe["alive_runs"] = [r for r in probe["status"]["runs"] if r["state"] in ("running", "launching")]
    probe["alive"] = [r["id"] for r in probe["alive_runs"]]
    return probe


def _record_fields(launch: Launch, probe: dict) -> dict:
    inputs, target, rev = launch.inputs, launch.target, launch.revision
    info = dict(target.info)
    if "preflight" in probe:
        pf = probe["preflight"]
        info["agent"] = {k: pf.get(k) for k in ("python", "tmux", "gpus", "hostname", "free_mb")}
    fields = {
        "project": launch.settings.project.name, "message": inputs.message, "target": target.name,
        "target_info": info, "machine": target.machine, "revision": inputs.revision or "",
        "revision_files": [{k: f[k] for k in ("path", "sha256", "mode", "size")} for f in rev.files] if rev else [],
        "git_commit": rev.git_commit if rev else None, "git_dirty": rev.git_dirty if rev else None,
        "git_diff": rev.git_diff if rev else None, "command": inputs.command if inputs.command is not None else inputs.argv or [], "config": launch.config,
        "batching": inputs.batching or {}, "batching_plan": launch.batching_plan, "parent": inputs.parent,
        "checkpoints": target.checkpoints, "gpus": launch.gpus, "sweep": launch.sweep,
    }
    if launch.venv is not None:
        from .envs import record

        fields["env"] = record(launch)
    if rev is None:
        fields.update(launch.inherited)
    return fields


@dataclass(frozen=True)
class Start:
    """How one target starts the new run: a job's node gets its launcher's argv and env and its own recovery."""

    argv: list
    env: dict
    experiment: dict  # its experiment.json
    recovery: dict
    alone: bool = True  # a launch on this target alone: it must not stop one node of another job


def locked_ops(launch: Launch, probe: dict, writer: checkpoints.Writer | None, exp: Experiment | None, key: str | None,
               registry_id: str, start: Start | None) -> tuple[list[Op], list[str]]:
    """The ops of the locked call, in the plan's order, with the key each result is known by; ``key`` is the
    new run's registry key (its folder ``runs/<key>-<id>``), ``start`` how it starts (None: nothing starts)."""
    target, settings, rev = launch.target, launch.settings, launch.revision
    project = settings.project.name
    action = checkpoint_action(launch.actions)
    ops: list[Op] = []
    keys: list[str] = []
    stopping = _stopping(launch, probe)
    if action != "keep":
        ops.append(checkpoints.check_op(target, stopping))
        keys.append("ckpt_check")
    for step in launch.actions:
        if isinstance(step, PushRevision) and rev is not None:  # its blobs were sent by _push
            ops.append(Op("revision_assemble", {"revision": rev.id, "files": rev.files}))
            keys.append("revision")
        elif isinstance(step, PushRevision):
            ops.append(Op("revision_assemble", {"revision": step.revision}))
            keys.append("revision")
        elif isinstance(step, BuildEnv) and launch.venv is not None:  # still there, under the lock
            ops.append(Op("env_use", {"hash": launch.venv["hash"]}))
            keys.append("env")
        elif isinstance(step, StopRun):
            by = {"experiment": exp.id if exp else None, "registry": registry_id, "clone": clone(settings)}
            ops.append(Op("run_stop", {"project": project, "ids": launch.stop_ids,
                                       "stop_timeout": settings.run.stop_timeout,
                                       "term_timeout": settings.run.term_timeout, "by": by}
                          | ({"registry": registry_id} if launch.stop_ids is not None else {})
                          # the start below replaces the project's tmux session: the stop leaves it to it
                          | ({"keep_session": True} if launch.has(StartRun) and not launch.beside else {})))
            keys.append("stop")
        elif isinstance(step, Checkpoints) and action != "keep":
            ops.append(checkpoints.trash_op(target, settings, action, probe.get("inventory"), writer, stopping,
                                            launch.inputs.parent, exp.id if exp else None))
            keys.append("trash")
        elif isinstance(step, Shell):
            ops.append(Op("shell", _shell_args(launch, step, exp, key)))
            keys.append("shell")
        elif isinstance(step, QueueRun):  # the target starts it when the run before it ends (runqueue)
            assert exp is not None and start is not None
            ops.append(Op("queue_add", {"exp_id": exp.id, "registry": key, "project": project,
                                        "revision": exp.revision, "argv": start.argv, "env": start.env,
                                        "experiment": start.experiment, "batching": exp.batching,
                                        "recovery": start.recovery, "start_idle": step.start_idle}
                          | ({"beside": launch.beside} if launch.beside else {})
                          | ({} if settings.run.standby else {"use_standby": False}) | _inherited(launch)))
            keys.append("queue")
        elif isinstance(step, StartRun):
            assert exp is not None and start is not None
            ops.append(Op("run_start", {"exp_id": exp.id, "registry": key, "project": project,
                                        "revision": exp.revision, "argv": start.argv, "env": start.env,
                                        "secrets": dict(launch.secrets), "experiment": start.experiment,
                                        "batching": exp.batching, "recovery": start.recovery}
                          | _notify_arg(launch, exp) | ({"beside": True} if launch.beside else {})
                          | scheduler.of(launch.target).submit(launch, exp)
                          | ({} if settings.run.standby else {"use_standby": False}) | _inherited(launch)))
            keys.append("start")
        elif isinstance(step, VerifyStarted) and exp is not None:
            ops.append(Op("run_verify", {"exp_id": exp.id, "registry": key, "wait": step.wait}))
            keys.append("verify")
    if exp is not None and "start" in keys:
        _check_start_first(launch, exp, key, ops, keys, spare_jobs=start.alone)
    if "start" in keys or "queue" in keys or action != "keep":  # after the stop: the runs it replaces are over
        first = next((i for i, k in enumerate(keys) if k in ("trash", "shell", "queue", "start")), len(keys))
        ops.insert(first, checkpoints.move_op(target))
        keys.insert(first, "ckpt_move")
    return ops, keys


def _inherited(launch: Launch) -> dict:
    """On the local target the run starts with this command's environment, umask and limits, as if the user had
    typed its command here (``agent/run/launch_env``); a remote target's agent gives it the login environment there."""
    if launch.target.spec.kind != "local":
        return {}
    from ..agent.run import launch_env

    found = launch_env.capture()
    found["env"] = {k: v for k, v in found["env"].items() if k not in _secret_names(launch)}  # they go as secrets do
    return {"launch": found}


def _secret_names(launch: Launch) -> set[str]:
    """The variables a run's record never holds: ``[project] secrets``, the one ``[notify] url_secret`` names, the
    webhook's own setting, and any other that carries one of their values."""
    import os

    notify = launch.settings.notify
    names = set(launch.secrets) | {"ORCH_NOTIFY__URL"} | ({notify.url_secret} if notify.url_secret else set())
    values = {v for v in launch.secrets.values() if v} | ({notify.url} if notify.url else set())
    values |= {os.environ[n] for n in names if os.environ.get(n)}
    return names | {k for k, v in os.environ.items() if v and v in values}


def _notify_arg(launch: Launch, exp: Experiment) -> dict:
    """``[notify]`` for the run's supervisor: its webhook's URL travels like a secret (``launch/notify.py``)."""
    from . import notify

    found = notify.spec(launch.settings, launch.target, exp.id, exp.parent)
    return {"notify": found} if found else {}


def _shell_args(launch: Launch, step: Shell, exp: Experiment | None, key: str | None) -> dict:
    """A shell step's op: in orch's root, the revision folder, or the new run's work folder (made for it)."""
    args: dict = {"argv": list(step.argv), "check": step.check, "timeout": step.timeout}
    root = launch.target.root
    if step.cwd == "work":
        assert exp is not None  # the playbook records the run before the step (playbooks.load_file)
        args["run"] = {"exp_id": exp.id, "registry": key, "revision": exp.revision}
    elif step.cwd == "revision":
        args["cwd"] = f"{root.rstrip('/')}/revisions/{launch.inputs.revision}"
    else:
        args["cwd"] = root
    return args


def _apply(launch: Launch, client: AgentClient, registry: Registry, probe: dict, exp: Experiment | None,
           out: Outcome, writer: checkpoints.Writer | None) -> list[tuple[str, Any]]:
    settings = launch.settings
    project = settings.project.name
    key = registry.run_registry(exp.id) if exp is not None else None
    from .envs import run_env

    recovery = scheduler.of(launch.target).recovery(settings.run.recovery() | ({"guard": out.guard} if out.guard
                                                                                else {}))
    start = Start(launch.inputs.argv or [], {**launch.env, **run_env(launch)},
                  {**_experiment_json(exp), "clone": clone(settings)}, recovery) if exp is not None else None
    ops, keys = locked_ops(launch, probe, writer, exp, key, registry.registry_id, start)
    payload = b""
    if probe.get("inline_push") is not None:  # a small push: its blobs go first, in this call (_push)
        op, payload = probe.pop("inline_push")
        ops.insert(0, op)
        keys.insert(0, "push")
    if not ops:
        return []
    timeout = settings.ssh.command_timeout + settings.run.stop_timeout + settings.run.term_timeout
    try:
        # the target journals each step in the new run's folder: a controller that never hears back can learn it
        # (a queued one's folder is made when it starts: an empty one would read as a crashed run meanwhile)
        journal = {"exp_id": exp.id, "registry": key, "project": project} \
            if exp is not None and not launch.has(QueueRun) else None
        values = client.call(ops, lock=settings.run.lock_timeout, what=launch.book.name, timeout=timeout,
                             journal=journal, payload=payload)
    except TransportError:
        raise  # what the target did is asked under its lock: launch_result.settle_interrupted
    except OrchError as exc:  # what the ops before the failure did happened: keep where the checkpoints went
        done = dict(zip(keys, exc.partial))
        out.checkpoints = done.get("trash", out.checkpoints)
        failed = keys[len(exc.partial)] if len(exc.partial) < len(keys) else None
        note, out.undo = way_back.after_failed_start(launch, client, registry, exp, done, failed)
        out.stopped = (done.get("stop") or {}).get("stopped", [])
        if note:
            exc.message = f"{exc.message}; {note}"
        raise
    return list(zip(keys, values))


def _check_start_first(launch: Launch, exp: Experiment, key: str | None, ops: list[Op], keys: list[str],
                       spare_jobs: bool) -> None:
    """Put ``run_check`` before the first op that changes what runs or where checkpoints are."""
    first = next((i for i, k in enumerate(keys) if k in ("stop", "trash", "shell", "start")), len(keys))
    pending = "revision" in keys[first:]
    ops.insert(first, Op("run_check", {"exp_id": exp.id, "registry": key,
                                       "project": launch.settings.project.name, "revision": exp.revision,
                                       "secrets": sorted(launch.secrets), "checkpoints": launch.target.checkpoints,
                                       "stops_runs": "stop" in keys, "revision_pending": pending,
                                       "spare_jobs": spare_jobs}
                     | ({"beside": launch.env.get("CUDA_VISIBLE_DEVICES", "")} if launch.beside else {})))
    keys.insert(first, "start_check")
    taken = scheduler.of(launch.target).check(launch, exp, key)
    if taken is not None:  # whether the scheduler takes the run (Slurm: partition, account, GPUs), before any change
        ops.insert(first + 1, taken)
        keys.insert(first + 1, taken.name)


def _record_moved(registry: Registry, value: dict) -> None:
    """This registry's rows whose checkpoint folder ``ckpt_move`` moved name where it is now."""
    for m in value.get("moved") or []:
        if m.get("registry") not in (None, registry.registry_id):
            continue
        try:
            row = registry.get(m["exp_id"])
        except OrchError:
            continue  # another clone's run, from before registry keys
        if (row.checkpoints or "").rstrip("/") == m["from"]:
            registry.update(row.id, checkpoints=m["to"])


def _record_results(launch: Launch, registry: Registry, results: list[tuple[str, Any]], out: Outcome) -> None:
    now = time.time()
    for key, value in results:
        if key == "stop":
            by = out.experiment.id if out.experiment is not None else None
            out.stopped = way_back.record_stopped(launch, registry, value, by)
        elif key == "trash":
            out.checkpoints = value
        elif key == "shell":
            out.shell.append(value)
        elif key == "ckpt_move":
            _record_moved(registry, value)
        elif key == "queue" and out.experiment is not None:
            fields = {"status": value["status"]}
            if value["status"] == "running":
                fields["started"] = value.get("started") or now
            out.queue = value
            out.experiment = registry.update(out.experiment.id, checkpoints_action="kept", **fields)
        elif key == "start" and out.experiment is not None and (value or {}).get("slurm"):
            info = dict(out.experiment.target_info or {}, slurm=value["slurm"])
            out.experiment = registry.update(out.experiment.id, target_info=info)
        elif key == "verify" and out.experiment is not None:
            exp = out.experiment
            fields: dict = {"status": value["state"]}
            if value["state"] != "queued":  # a Slurm job pending for its nodes has not started
                fields["started"] = value.get("started") or now
            if value.get("slurm"):
                out.queue = {"slurm": value["slurm"]}
            if value.get("attempts"):
                fields["attempts"] = value["attempts"]
            if value["state"] in ("finished", "crashed", "stopped"):
                fields.update(exit_code=value["exit_code"], ended=value.get("ended") or now)
            fields.update(checkpoints.record(out.checkpoints) or {"checkpoints_action": "kept"})
            out.experiment = registry.update(exp.id, **fields)
    if out.experiment is not None and out.experiment.status == "launching":
        out.experiment = registry.update(out.experiment.id, status="running", started=now,
                                         checkpoints_action=(out.checkpoints or {}).get("action", "kept"))
