"""Running a playbook against a target: two agent calls (three with a push), recorded in the registry.

Execution has two phases so that nothing changes before everything has been checked:

1. **probe** (one unlocked agent call): preflight, which blobs the target lacks, what runs, what the
   checkpoint folder holds. Then, locally: confirmation; the blobs the target lacks are streamed
   (``push``, unlocked: storing them changes nothing visible); the experiment row (``launching``).
2. **apply** (one agent call holding the target's lock): assemble the revision, check the
   checkpoint folder is safe and that the new run can start (``run_check``), stop the old run, move
   checkpoints, shell steps, start, verify.

If phase 2 fails the new experiment is marked ``failed`` with the error, never left ``launching``; if it
failed at the start, after the old run was stopped, the checkpoints it moved are put back (``way_back``).
If it is interrupted (Ctrl-C, SIGTERM, SIGHUP, a dropped link), the agent finishes the step in progress
and stops at the next one; orch then asks the target what was done, records that, and says it in one
line (``Interrupted``). If orch itself is killed (SIGKILL), the row's launch lock (``launch_guard``) is
dropped by the kernel and the next command that reaches the target settles it (``status.reconcile``).
With ``wait`` the run is watched until its first metric line, its end, or the time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from . import result as launch_result, way_back
from .. import signals
from ..reach.agent_client import AgentClient, Op
from ..config import Settings
from ..errors import InputError, Interrupted, OrchError, TransportError
from ..records.experiments import Experiment, Registry
from .guard import LaunchGuard
from ..watch.metrics import format_size as _size
from .playbooks import (Checkpoints, Inputs, Playbook, Preflight, PushRevision, Shell, StartRun, StopRun,
                        VerifyStarted, checkpoint_action)
from .revisions import Revision
from ..records.reconcile import reconcile
from ..reach.targets import Target


@dataclass
class Launch:
    """One operation, fully resolved before any I/O: what ``--dry-run`` shows."""

    settings: Settings
    target: Target
    book: Playbook
    inputs: Inputs
    revision: Revision | None = None
    env: dict = field(default_factory=dict)
    secrets: dict = field(default_factory=dict, repr=False)  # name -> value: only ever sent in the agent's stdin
    config: dict = field(default_factory=dict)
    batching_plan: dict | None = None
    inherited: dict = field(default_factory=dict)  # a restart's revision files and git facts, from its parent
    yes: bool = False
    confirm: Callable[[str], bool] | None = None
    echo: Callable[[str], None] = lambda _msg: None
    wait: float = 0.0  # seconds to watch a started run for its first metric line
    progress: bool = False  # progress bars on stderr for big pushes


@dataclass
class Outcome:
    experiment: Experiment | None = None
    stopped: list = field(default_factory=list)
    checkpoints: dict | None = None
    pushed: dict = field(default_factory=dict)
    shell: list = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    waited: dict | None = None  # what --wait saw: the first metric line, or how the run ended
    undo: dict = field(default_factory=dict)  # registry fields after a failed apply (checkpoints put back)


def clone(settings: Settings) -> dict:
    """Which clone of the project starts a run (recorded in its experiment.json): another clone that stops
    it can say whose run it stopped."""
    import socket

    return {"host": socket.gethostname(), "path": str(settings.project_dir)}


def _experiment_json(exp: Experiment) -> dict:
    return {k: v for k, v in exp.public().items() if k not in ("config",)} | {"project": exp.project}


def execute(launch: Launch, registry: Registry) -> Outcome:
    with signals.as_interrupts():  # SIGTERM, SIGHUP: recorded like Ctrl-C, not left "launching"
        return _execute(launch, registry)


def _execute(launch: Launch, registry: Registry) -> Outcome:
    book, target, inputs = launch.book, launch.target, launch.inputs
    settings = launch.settings
    project = settings.project.name
    out = Outcome()
    assert target.connect is not None
    if book.has("record"):
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
        if book.has("stop_run") and book.has("start_run"):  # never one node of a job stopped alone
            from . import spare_jobs

            spare_jobs.check({target.machine: probe["alive_runs"]}, {target.machine: target.label},
                             registry.registry_id, book.name)
        action = _checkpoint_action(book, inputs)
        writer = _writer(probe, settings)
        if action != "keep":
            _confirm_checkpoints(launch, probe["inventory"], action, writer)
        elif book.has("start_run"):
            _notice_checkpoints(launch, probe.get("inventory"), writer)
        _push(launch, client, probe, out)
        exp = None
        try:
            if book.has("record"):
                # numbered by this registry alone: its runs' folders on the target carry its id (runs/<id>-<n>)
                exp = registry.create(launcher=guard, **_record_fields(launch, probe))
                out.experiment = exp
            results = _apply(launch, client, registry, probe, action, exp, out, writer)
        except (KeyboardInterrupt, TransportError) as exc:
            transport.close()
            how, code = signals.describe(exc)
            truth = launch_result.reconcile(launch, registry, probe, exp, out, how)
            if isinstance(exc, TransportError):
                raise TransportError(f"{exc.message}; {truth}", hint=exc.hint) from None
            raise Interrupted(f"{how}: {truth}", exit_code=code) from None
        except BaseException as exc:
            if exp is not None:
                moved = {"checkpoints_action": out.checkpoints["action"],  # the trash op ran before the failure
                         "checkpoints_entry": out.checkpoints.get("entry_path")} if out.checkpoints else {}
                moved.update(out.undo)
                registry.update(exp.id, status="failed", ended=time.time(), error=str(exc)[:2000], **moved)
                out.experiment = registry.get(exp.id)
            raise
        _record_results(launch, registry, results, out)
        guard.release()
        if launch.wait and out.experiment is not None and out.experiment.status == "running":
            try:
                out.waited = launch_result.wait_first_metric(launch, client, out.experiment,
                                                             registry.run_registry(out.experiment.id))
            except KeyboardInterrupt as exc:
                how, code = signals.describe(exc)
                raise Interrupted(f"{how} while waiting: experiment {out.experiment.id} was started on "
                                  f"{target.label} and goes on (orch status, orch logs --follow)",
                                  exit_code=code) from None
            launch_result.record_wait(registry, out)
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

    if launch.revision is None or not launch.book.has("push_revision"):
        return
    try:
        out.pushed = push.send(client, launch.revision, probe.get("missing") or {}, show=launch.progress,
                               stall=launch.settings.ssh.command_timeout)
    except KeyboardInterrupt as exc:
        how, code = signals.describe(exc)
        raise Interrupted(f"{how} during the push: nothing was changed on the target; what was sent is kept, "
                          "and the next deploy sends only the rest", exit_code=code) from None
    except TransportError as exc:
        raise TransportError(f"{exc.message}; nothing was changed on the target, and what was sent is kept",
                             hint="deploy again: only what is still missing is sent") from None


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
    return {"stop": probe["alive"] if launch.book.has("stop_run") else [],
            "checkpoints": probe.get("inventory"), "writer": _writer(probe, launch.settings), "send": send}


def _writer(probe: dict, settings: Settings) -> Writer | None:
    return checkpoint_writer(probe["status"]["runs"], probe.get("inventory"), clone(settings))


@dataclass(frozen=True)
class Writer:
    """The run that wrote a checkpoint folder's newest file; ``clone`` when another clone of the project
    started it (its experiment numbers are that clone's own)."""

    id: int
    clone: dict | None = None

    def __str__(self) -> str:
        if not self.clone:
            return f"experiment {self.id}"
        return (f"experiment {self.id} of another clone of this project "
                f"({self.clone.get('host', '?')}, {self.clone.get('path', '?')})")


def checkpoint_writer(runs: list[dict], inv: dict | None, mine: dict | None = None) -> Writer | None:
    """The run that wrote the checkpoint folder's newest file, as far as the target's run records tell: of the
    runs using the folder, the last one started before that file was written (and not ended before it)."""
    if not inv or not inv.get("files"):
        return None
    users = [r for r in runs if r.get("id") is not None and r.get("started")
             and str(r.get("checkpoints") or "").rstrip("/") == inv["path"].rstrip("/")]
    newest = inv.get("newest_mtime")
    during = [r for r in users if newest is not None
              and r["started"] - 2 <= newest <= (r.get("ended") or float("inf")) + 2]
    chosen = during or users
    if not chosen:
        return None
    run = max(chosen, key=lambda r: (r["started"], r["id"]))  # numbers of two clones do not compare
    other = run.get("clone") if mine is not None and run.get("clone") not in (None, mine) else None
    return Writer(run["id"], other)


def _notice_checkpoints(launch: Launch, inv: dict | None, writer: Writer | None) -> None:
    if not inv or not inv["files"]:
        return
    by = f", written by {writer}" if writer is not None else ""
    launch.echo(f"checkpoints: {inv['path']} holds {inv['files']} file(s), {_size(inv['bytes'])} "
                f"(newest {inv['newest']}{by}); the run will see them (--clean-checkpoints moves them aside)")


def _checkpoint_action(book: Playbook, inputs: Inputs) -> str:
    steps = [s for s in book.steps if isinstance(s, Checkpoints)]
    return checkpoint_action(steps[0], inputs) if steps else "keep"


def _probe(launch: Launch, client: AgentClient, project: str, registry: Registry | None = None) -> dict:
    book, target = launch.book, launch.target
    ops: list[Op] = []
    keys: list[str] = []
    for step in book.steps:
        if isinstance(step, Preflight) and "preflight" not in keys:
            ops.append(Op("preflight", {"min_free_mb": step.min_free_mb}))
            keys.append("preflight")
    if book.has("push_revision") and launch.revision is not None and launch.revision.files:
        hashes = sorted({f["sha256"] for f in launch.revision.files})
        ops.append(Op("blobs_missing", {"hashes": hashes}))
        keys.append("missing")
    ops.append(Op("status", {"project": project, "tail": False, "gpus": False}))  # preflight reports GPUs
    keys.append("status")
    action = _checkpoint_action(book, launch.inputs)
    cleaning = action != "keep"
    if book.has("start_run") or cleaning:
        ckpt = {"path": target.checkpoints, "configured": target.checkpoints}
        # refuse an unsafe folder, or one a clean would fail on, before anything changes
        ops.append(Op("ckpt_check", {**ckpt, "busy_check": False, "movable": cleaning}))
        # what is there (said before the run sees it); what retention would delete; for --purge every file
        ops.append(Op("ckpt_inventory", {**ckpt, **_retention(launch.settings), "full": action == "purge",
                                         "ignore": launch.settings.checkpoints.ignore}))
        keys += ["ckpt_safe", "inventory"]
    if registry is not None:
        values = reconcile(launch.settings, target, registry, client, also=ops)
    else:
        values = client.call(ops, what=f"{book.name} (probe)")
    probe = dict(zip(keys, values))
    probe["alive_runs"] = [r for r in probe["status"]["runs"] if r["state"] in ("running", "launching")]
    probe["alive"] = [r["id"] for r in probe["alive_runs"]]
    return probe


def _retention(settings: Settings) -> dict:
    max_gb = settings.trash.max_gb
    return {"keep": settings.trash.keep, "max_bytes": int(max_gb * (1 << 30)) if max_gb else None}


def _confirm_checkpoints(launch: Launch, inv: dict, action: str, writer: Writer | None = None) -> None:
    if not inv["files"]:
        return
    verb = "PERMANENTLY DELETE" if action == "purge" else "move to the trash"
    by = f", written by {writer}" if writer is not None else ""
    question = (f"{verb} {inv['files']} file(s), {_size(inv['bytes'])} (newest {inv['newest']}{by}) "
                f"from {inv['path']} on {launch.target.label}?")
    launch.echo(f"checkpoints: {inv['files']} file(s), {_size(inv['bytes'])} in {inv['path']} "
                f"(newest {inv['newest']}{by})")
    doomed = (inv.get("retention") or []) if action == "move" else []  # a purge leaves the trash alone
    if doomed:
        names = ", ".join(f"{d['entry']} ({_size(d['bytes'])})" for d in doomed)
        launch.echo(f"trash retention ([trash] keep / max_gb) will PERMANENTLY DELETE {len(doomed)} older "
                    f"trash entr{'y' if len(doomed) == 1 else 'ies'}: {names}")
        question = question[:-1] + f", and PERMANENTLY DELETE trash entries {', '.join(d['entry'] for d in doomed)}?"
    if launch.yes:
        return
    if launch.confirm is None:
        raise InputError(f"refusing to {verb.lower()} checkpoints without confirmation",
                         hint="rerun with --yes to confirm, or in a terminal to be asked")
    if not launch.confirm(question):
        raise InputError("cancelled: the checkpoints were left as they are")


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
        "checkpoints": target.checkpoints,
    }
    if rev is None:
        fields.update(launch.inherited)
    return fields


def _apply(launch: Launch, client: AgentClient, registry: Registry, probe: dict, action: str,
           exp: Experiment | None, out: Outcome, writer: Writer | None) -> list[tuple[str, Any]]:
    book, target, settings, rev = launch.book, launch.target, launch.settings, launch.revision
    project = settings.project.name
    ckpt = {"path": target.checkpoints, "configured": target.checkpoints}
    ops: list[Op] = []
    keys: list[str] = []
    stopping = probe["alive"] if book.has("stop_run") else []
    if action != "keep":
        ops.append(Op("ckpt_check", {**ckpt, "stopping": stopping, "movable": True}))
        keys.append("ckpt_check")
    for step in book.steps:
        if isinstance(step, PushRevision) and rev is not None:  # its blobs were sent by _push
            ops.append(Op("revision_assemble", {"revision": rev.id, "files": rev.files}))
            keys.append("revision")
        elif isinstance(step, PushRevision):
            ops.append(Op("revision_assemble", {"revision": launch.inputs.revision}))
            keys.append("revision")
        elif isinstance(step, StopRun):
            by = {"experiment": exp.id if exp else None, "registry": registry.registry_id, "clone": clone(settings)}
            ops.append(Op("run_stop", {"project": project, "ids": None, "stop_timeout": settings.run.stop_timeout,
                                       "term_timeout": settings.run.term_timeout, "by": by}))
            keys.append("stop")
        elif isinstance(step, Checkpoints) and action != "keep":
            # the entry is named after the experiment whose checkpoints it holds, and records who moved them
            owner = writer.id if writer is not None else (max(stopping) if stopping else launch.inputs.parent)
            inv = probe.get("inventory") or {}
            ops.append(Op("ckpt_trash", {**ckpt, "label": f"exp{owner}" if owner is not None else "unknown",
                                         "moved_by": exp.id if exp else None, "stopping": stopping,
                                         **_retention(settings), "purge": action == "purge",
                                         "purge_only": inv.get("all_files"),
                                         "retention_allowed": [d["entry"] for d in inv.get("retention", [])]}))
            keys.append("trash")
        elif isinstance(step, Shell):
            cwd = target.root if step.cwd == "root" else f"{target.root.rstrip('/')}/revisions/{launch.inputs.revision}"
            ops.append(Op("shell", {"argv": step.argv, "cwd": cwd, "check": step.check, "timeout": step.timeout}))
            keys.append("shell")
        elif isinstance(step, StartRun):
            assert exp is not None
            ops.append(Op("run_start", {"exp_id": exp.id, "registry": registry.run_registry(exp.id),
                                        "project": project, "revision": exp.revision,
                                        "argv": launch.inputs.argv, "env": launch.env, "secrets": dict(launch.secrets),
                                        "experiment": {**_experiment_json(exp), "clone": clone(launch.settings)},
                                        "batching": exp.batching, "recovery": settings.run.recovery()}))
            keys.append("start")
        elif isinstance(step, VerifyStarted) and exp is not None:
            ops.append(Op("run_verify", {"exp_id": exp.id, "registry": registry.run_registry(exp.id),
                                         "wait": step.wait}))
            keys.append("verify")
    if not ops:
        return []
    if exp is not None and "start" in keys:
        _check_start_first(launch, registry, exp, ops, keys)
    timeout = settings.ssh.command_timeout + settings.run.stop_timeout + settings.run.term_timeout
    try:
        # the target journals each step in the new run's folder: a controller that never hears back can learn it
        journal = {"exp_id": exp.id, "registry": registry.run_registry(exp.id), "project": project} \
            if exp is not None else None
        values = client.call(ops, lock=settings.run.lock_timeout, what=book.name, timeout=timeout, journal=journal)
    except TransportError:
        raise  # what the target did is asked under its lock: launch_result.reconcile
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


def _check_start_first(launch: Launch, registry: Registry, exp: Experiment, ops: list[Op], keys: list[str]) -> None:
    """Put ``run_check`` before the first op that changes what runs or where checkpoints are."""
    first = next((i for i, k in enumerate(keys) if k in ("stop", "trash", "shell", "start")), len(keys))
    pending = "revision" in keys[first:]
    ops.insert(first, Op("run_check", {"exp_id": exp.id, "registry": registry.run_registry(exp.id),
                                       "project": launch.settings.project.name, "revision": exp.revision,
                                       "secrets": sorted(launch.secrets), "checkpoints": launch.target.checkpoints,
                                       "stops_runs": "stop" in keys, "revision_pending": pending,
                                       "spare_jobs": True}))
    keys.insert(first, "start_check")


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
        elif key == "verify" and out.experiment is not None:
            exp = out.experiment
            fields: dict = {"status": value["state"], "started": value.get("started") or now}
            if value.get("attempts"):
                fields["attempts"] = value["attempts"]
            if value["state"] in ("finished", "crashed", "stopped"):
                fields.update(exit_code=value["exit_code"], ended=value.get("ended") or now)
            if out.checkpoints:
                fields.update(checkpoints_action=out.checkpoints["action"],
                              checkpoints_entry=out.checkpoints.get("entry_path"))
            else:
                fields.update(checkpoints_action="kept")
            out.experiment = registry.update(exp.id, **fields)
    if out.experiment is not None and out.experiment.status == "launching":
        out.experiment = registry.update(out.experiment.id, status="running", started=now,
                                         checkpoints_action=(out.checkpoints or {}).get("action", "kept"))
