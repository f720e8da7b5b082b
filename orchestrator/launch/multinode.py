"""A job over several nodes: gang deploy, stop and status, each node reached in parallel.

Composes the single-target pieces (``operations._probe``, ``push.send``, ``operations.locked_ops``: the
playbook's actions as agent ops, the same on every node as on one target) with one transport per node::

    probe + push on every node (parallel) --any failed--> row "failed" naming the node; nothing started
        |
    row "launching" (one id for every node) -> start every node at once (the others' launchers wait for
        |                                          node 0's rendezvous, as hand-typed torchrun commands do)
        |
    row "running" with ``nodes``: one record per node (rank, target, CT, address, state, exit code)

Every node is reached through ``target.connect()``, as a single target is: the connection keeper's held
connection and its resident agent where they serve, so a warm job costs about what a warm single deploy costs.
The launcher lines come from ``distributed.plan`` (pure).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from .. import checkpoints, signals
from . import distributed
from ..watch import job_progress as progress
from ..records import job_settle, launch_journal
from ..reach.agent_client import AgentClient, Op
from ..errors import InputError, Interrupted, NotFoundError, OrchError
from ..records.experiments import Experiment, Registry, clone
from . import playbooks
from .model import Launch, PushRevision, StartRun, StopRun
from .operations import Start, _experiment_json, _probe, _record_fields, _writer, locked_ops
from ..reach.targets import Target


@dataclass
class Group:
    """The nodes of a job, node 0 first; ``flags`` is how they were named (for the current target)."""

    name: str
    members: list[Target]
    flags: list[dict] = field(default_factory=list)
    configured: bool = False  # named by a kind = "group" target

    @property
    def label(self) -> str:
        return f"{len(self.members)} nodes: " + ", ".join(m.label for m in self.members)


@dataclass
class Node:
    rank: int
    target: Target
    settings: Any
    launch: Launch | None = None
    client: AgentClient | None = None
    probe: dict = field(default_factory=dict)
    route: dict = field(default_factory=dict)
    pushed: dict = field(default_factory=dict)
    trash: dict | None = None  # where --clean-checkpoints moved this node's checkpoints
    error: OrchError | None = None
    read_only: bool = False  # reads bounded by [ssh] read_timeout: a node cut off fails fast
    stopped: list = field(default_factory=list)  # the runs this node's launch stopped
    shell: list = field(default_factory=list)  # what the plan's shell steps answered on this node

    def close(self) -> None:
        if self.client is not None:
            self.client.transport.close()
            self.client = None


def node_specs(settings, names: list[str], cts: list[int]) -> tuple[str, list[dict], bool] | None:
    """The nodes repeated ``--target``/``--ct`` flags (or one group target) name; None for one target."""
    if len(names) == 1 and not cts and settings.targets.get(names[0]) is not None \
            and settings.targets[names[0]].kind == "group":
        return names[0], [{"target": m} for m in settings.targets[names[0]].members], True
    specs = [{"target": n} for n in names] + [{"ct": c} for c in cts]
    if len(specs) < 2:
        return None
    return "+".join(s.get("target") or f"ct{s['ct']}" for s in specs), specs, False


def group_for(settings, names: list[str], cts: list[int],
              resolve: Callable[[str | None, int | None], Target], recorded: list[dict] | None = None) -> Group | None:
    """The group the flags name; ``recorded``: the current target's nodes, in their order."""
    found = node_specs(settings, names, cts)
    if recorded and len(recorded) > 1:
        found = ("+".join(s.get("target") or f"ct{s.get('ct')}" for s in recorded), recorded, False)
    if found is None:
        return None
    name, specs, configured = found
    members = [resolve(s.get("target"), s.get("ct")) for s in specs]
    machines = [m.machine for m in members]
    if len(set(machines)) != len(machines):
        raise InputError(f"{name}: a machine is named twice ({', '.join(machines)})",
                         hint="name each node once; one node runs several processes with nproc_per_node")
    return Group(name, members, specs, configured)


def _parallel(fn: Callable[[Node], None], nodes: list[Node]) -> None:
    """Run ``fn`` on every node at once, a thread per node; a node's OrchError is kept on it, never raised here.

    The threads are daemons and are waited on in short joins: Ctrl-C (or SIGTERM) reaches this thread at once,
    the caller's cleanup closes the nodes' connections, and a node still being asked never holds orch's exit."""
    failed: list[BaseException] = []

    def guarded(node: Node) -> None:
        try:
            fn(node)
        except OrchError as exc:
            node.error = exc
        except BaseException as exc:  # a bug, not a node's answer: raised in the caller's thread
            failed.append(exc)

    if len(nodes) <= 1:
        for node in nodes:
            guarded(node)
    else:
        threads = [threading.Thread(target=guarded, args=(n,), name=f"node-{n.rank}", daemon=True) for n in nodes]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.2)
    if failed:
        raise failed[0]


def _connect(node: Node) -> AgentClient:
    settings = node.settings
    if node.client is None:
        assert node.target.connect is not None
        if node.read_only:
            node.client = AgentClient(node.target.connect(), node.target.root, node.target.python,
                                      timeout=settings.ssh.read_timeout, timeout_setting="[ssh] read_timeout")
        else:
            node.client = AgentClient(node.target.connect(), node.target.root, node.target.python,
                                      timeout=settings.ssh.command_timeout)
    return node.client


def address_of(target: Target) -> str | None:
    """The address other nodes reach ``target`` at, as far as the configuration and the API say."""
    spec = target.spec
    return target.info.get("address") or spec.address or (spec.host if spec.kind == "ssh" else None) or \
        ("127.0.0.1" if spec.kind == "local" else None)


def _failure(node: Node, exc: OrchError, what: str) -> str:
    return f"node {node.rank} ({node.target.label}): {what}: {exc.message}"


job_state = job_settle.state


def prepare_nodes(launch: Launch, group: Group) -> list[Node]:
    """One ``Launch`` per node: the same playbook, revision, command and settings, each node's own paths, so
    every node runs the same actions."""
    nodes = []
    for rank, tgt in enumerate(group.members):
        inputs = replace(launch.inputs, target=tgt.name, root=tgt.root, checkpoints=tgt.checkpoints)
        mine = replace(launch, target=tgt, inputs=inputs, actions=playbooks.plan(launch.book, inputs), progress=None)
        nodes.append(Node(rank, tgt, launch.settings, mine))
    return nodes


def plan(launch: Launch, group: Group) -> tuple:
    """The job's actions as its dry run shows them: the playbook's steps, each run on every node."""
    return playbooks.plan(launch.book, replace(launch.inputs, target=group.name), nodes=len(group.members))


def plan_runs(launch: Launch, nodes: list[Node], exp_id: int | None) -> list[distributed.NodeRun]:
    facts = [distributed.NodeFacts(n.rank, n.target.name, n.route.get("address") or address_of(n.target),
                                   n.route.get("interface"), len((n.probe.get("preflight") or {}).get("gpus") or []))
             for n in nodes]
    if nodes and address_of(nodes[0].target):  # peers reach node 0 at the address the configuration names
        facts[0] = replace(facts[0], address=address_of(nodes[0].target))
    command = launch.inputs.command if launch.inputs.command is not None else launch.inputs.argv or []
    return distributed.plan(facts, command, launch.settings.distributed,
                            launch.settings.project.name, exp_id, restarts=launch.settings.run.restarts)


def _check_runs(launch: Launch, nodes: list[Node]) -> None:
    from .limits import check_start

    for run in plan_runs(launch, nodes, None):
        check_start(run.argv, {**launch.env, **run.env}, launch.secrets, f"node {run.rank}'s command")


def _route(master: str | None) -> tuple:
    """The probe's extra op: the node's address and interface toward node 0 (``master``)."""
    return (("route", Op("net_route", {"peer": master})),)


def _probe_node(node: Node, master: str | None) -> None:
    launch = node.launch
    assert launch is not None
    client = _connect(node)
    from . import push

    ahead = push.changed_ahead(launch.revision) \
        if launch.revision is not None and launch.has(PushRevision) and launch.revision.files else None
    node.probe = _probe(launch, client, launch.settings.project.name, also=_route(master), store=ahead)
    from ..watch import doctor

    doctor.refuse(node.probe.get("findings"), node.target.label, launch.echo)
    node.route = node.probe["route"]


def _push_node(node: Node) -> None:
    from . import push

    launch = node.launch
    assert launch is not None
    if launch.revision is not None and launch.has(PushRevision):
        node.pushed = push.send(_connect(node), launch.revision, node.probe.get("missing") or {},
                                stall=launch.settings.ssh.command_timeout)
    from .operations import build_env

    build_env(launch, _connect(node), node.probe)  # each node's env before any node stops


def _confirm_clean(nodes: list[Node], action: str) -> None:
    """One question per node whose checkpoint folder holds files (none with --yes)."""
    for n in nodes:
        inv, launch = n.probe.get("inventory"), n.launch
        if inv and launch is not None:
            checkpoints.confirm_launch(inv, action, launch.target.label,
                                       checkpoints.writer(n.probe["status"]["runs"], inv, clone(launch.settings)),
                                       yes=launch.yes, confirm=launch.confirm, echo=launch.echo)


def preview(launch: Launch, group: Group) -> list[dict]:
    """What each node would run (``--dry-run``): reached read-only where possible."""
    nodes = prepare_nodes(launch, group)
    master = address_of(group.members[0])

    def look(node: Node) -> None:
        if node.target.connect is None:
            return
        node.probe = _probe(node.launch, _connect(node), launch.settings.project.name,  # type: ignore[arg-type]
                            also=_route(master))
        node.route = node.probe["route"]

    try:
        _parallel(look, nodes)
    finally:
        for n in nodes:
            n.close()
    return [{"rank": r.rank, "target": n.target.label, "argv": r.argv, "env": r.env,
             "unreachable": n.error.message if n.error else None}
            for n, r in zip(nodes, plan_runs(launch, nodes, None))]


def deploy(launch: Launch, group: Group, registry: Registry, stopped: list | None = None,
           shell: list | None = None) -> Experiment:
    """Gang launch: nothing starts anywhere unless every node passed its preflight and push.

    ``stopped`` gets one entry per run of this project the start stopped on a node (``id``, ``state``,
    ``exit_code``, ``node``, ``label``, ``mine``); each is recorded as stopped by the new job. ``shell`` gets
    what each node's shell steps answered (``node``, ``label`` and the step's ``stdout``, ``skipped``...)."""
    from ..records.launch_guard import LaunchGuard

    if not launch.has(StartRun):
        raise InputError(f"playbook {launch.book.name} starts no run: a job over several nodes needs a "
                         "start_run step", hint="add start_run (after record) to the playbook, or name one target")
    nodes = prepare_nodes(launch, group)
    _check_runs(launch, nodes)  # a command no node could start is refused before any node is asked
    guard = LaunchGuard(registry.path.parent)
    try:
        master = address_of(group.members[0])
        _parallel(lambda n: _probe_node(n, master), nodes)
        from . import spare_jobs  # another job with a node outside this one would lose only its nodes here

        spare_jobs.check({n.target.machine: n.probe["alive_runs"] for n in nodes if n.error is None},
                         {n.target.machine: n.target.label for n in nodes}, registry.registry_id, launch.book.name)
        if launch.inputs.checkpoint_action != "keep" and not any(n.error for n in nodes):
            _confirm_clean(nodes, launch.inputs.checkpoint_action)
        _parallel(_push_node, [n for n in nodes if n.error is None])
        if master is None and nodes[0].error is None:  # node 0's address from its own routes: ask the rest again
            master = nodes[0].route.get("address")
            _parallel(lambda n: n.route.update(_connect(n).one("net_route", peer=master)), nodes[1:])
        failed = [n for n in nodes if n.error is not None]
        fields = _record_fields(nodes[0].launch, nodes[0].probe) if nodes[0].probe else \
            _record_fields(nodes[0].launch, {})  # type: ignore[arg-type]
        fields.update(target=group.name, target_info={**fields["target_info"], "group": group.name,
                                                       "members": [m.name for m in group.members]})
        if failed:
            why = "; ".join(_failure(n, n.error, "preflight or push") for n in failed)  # type: ignore[arg-type]
            exp = registry.create(**fields, status="failed", ended=time.time(),
                                  error=why[:2000], nodes=_records(nodes, None, []))
            err = failed[0].error
            raise type(err)(f"{why}; nothing was started on any node (experiment {exp.id} failed)",
                            hint=err.hint)
        _check_runs(launch, nodes)  # again with the nodes' own addresses and GPU counts, before anything stops
        previous = _current_job(registry, group) if launch.has(StopRun) else None
        # the job this one replaces stops on every node at once, each node's part in that node's start call: once
        # it stopped, the node's agent starts the new part whoever listens (agent.__main__.committed)
        halt = (previous.id, registry.run_registry(previous.id)) if previous is not None else None
        with registry.batch():  # the row and its nodes in one transaction: an interrupted launch knows its nodes
            exp = registry.create(launcher=guard, **fields)
            key = registry.run_registry(exp.id)  # the run folders are runs/<registry id>-<id>, like a single run's
            rid = registry.registry_id  # who stopped a run: read here, the registry belongs to this thread
            runs = plan_runs(launch, nodes, exp.id)
            exp = registry.update(exp.id, nodes=_records(nodes, runs, []))
        started: dict = {}  # every node at once: a node that fails is seen with the others' starts done
        try:
            with signals.as_interrupts():  # SIGTERM, SIGHUP: said like Ctrl-C, with what each node does
                _parallel(lambda n: started.update({n.rank: _start_one(n, runs[n.rank], exp, key, rid, halt)}),
                          nodes)
        except KeyboardInterrupt as exc:
            how, code = signals.describe(exc)
            told = interrupted(nodes, dict(started), previous.id if previous is not None else None)
            raise Interrupted(f"{how}: {told}", exit_code=code) from None
        if shell is not None:
            shell.extend({"node": n.rank, "label": n.target.label, **v} for n in nodes for v in n.shell)
        failed = [n for n in nodes if n.error is not None]
        if failed:
            found = _record_stopped(launch.settings.project.name, registry, nodes, exp.id)
            if stopped is not None:
                stopped.extend(found)
            why = "; ".join(_failure(n, n.error, "start") for n in failed)  # type: ignore[arg-type]
            unstopped = _stop_everywhere(nodes, exp.id, key)
            why += "".join(f"; {_failure(n, err, 'its part may have started and could not be stopped')}"
                           for n, err in unstopped)
            why += "".join(f"; node {n.rank}'s checkpoints were moved to {n.trash['entry_path']} (orch checkpoints "
                           f"restore {n.trash['entry']} --ct/--target of that node brings them back)"
                           for n in nodes if n.trash and n.trash.get("entry_path"))
            registry.update(exp.id, status="failed", ended=time.time(), error=why[:2000],
                            nodes=_records(nodes, runs, [started.get(n.rank) for n in nodes]))
            raise type(failed[0].error)(f"{why}; the job was stopped on every node that answered",
                                        hint=failed[0].error.hint)  # type: ignore[union-attr]
        states = [started[n.rank] for n in nodes]
        records = _records(nodes, runs, states)
        done = job_settle.settle(records)
        acted = [r for r in records if r.get("checkpoints_action") not in (None, "kept")]
        fields = {"status": "running", "started": time.time(), "nodes": records,
                  "checkpoints_action": acted[0]["checkpoints_action"] if acted else "kept",
                  "checkpoints_entry": acted[0]["checkpoints_entry"] if acted else None}
        if done is not None:  # every node ended within its start check
            fields.update(done, ended=done["ended"] or time.time())
        with registry.batch():  # what the starts stopped and the job's state: one transaction
            found = _record_stopped(launch.settings.project.name, registry, nodes, exp.id)
            if stopped is not None:
                stopped.extend(found)
            return registry.update(exp.id, **fields)
    finally:
        guard.release()
        for n in nodes:
            n.close()


def interrupted(nodes: list[Node], started: dict, previous: int | None) -> str:
    """What an interrupted job start left on its nodes, in one line: the nodes whose start answered, and what the
    others do by themselves (their agents finish a start once its old part stopped, and start nothing before);
    with the command that relaunches the job it replaced."""
    where = {n.rank: f"node {n.rank} ({n.target.label})" for n in nodes}
    done = [where[n.rank] for n in nodes if n.rank in started]
    failed = [f"{where[n.rank]}: its start failed ({n.error.message})" for n in nodes
              if n.rank not in started and n.error is not None]
    pending = [where[n.rank] for n in nodes if n.rank not in started and n.error is None]
    said = ([f"started on {', '.join(done)}"] if done else []) + failed
    if pending and previous is not None:
        said.append(f"{', '.join(pending)} had not answered: each finishes its start by itself once its part of "
                    f"experiment {previous} stopped, or leaves that part running if its stop had not begun; "
                    "orch status shows which")
    elif pending:
        said.append(f"{', '.join(pending)} had not answered (orch status shows whether each started)")
    if previous is not None:
        said.append(f"to go back: orch restart -e {previous}")
    return "; ".join(said)


def _start_one(node: Node, run: distributed.NodeRun, exp: Experiment, key: str | None, rid: str,
               halt: tuple[int, str | None] | None = None) -> dict:
    """The plan's locked steps on one node, as on a single target: its old run stopped, its checkpoints handled,
    its shell steps, then its part of the job started and verified. ``halt`` (id, registry key): the job this one
    replaces, its part here stopped first in the same call (SIGTERM, what torchrun takes as "stop the job")."""
    launch = node.launch
    assert launch is not None
    settings = launch.settings
    client = _connect(node)
    from .envs import run_env

    start = Start(run.argv, {**launch.env, **run_env(launch), **run.env},
                  _experiment_json(exp) | {"checkpoints": node.target.checkpoints},
                  _node_recovery(settings, run, key), alone=False)
    ops, keys = locked_ops(launch, node.probe, _writer(node.probe, settings), exp, key, rid, start)
    if halt is not None:
        at = keys.index("stop")
        ops.insert(at, Op("run_stop", {"project": settings.project.name, "ids": [halt[0]], "stop_timeout": 0,
                                       "term_timeout": settings.run.term_timeout, "term_first": True,
                                       "registry": halt[1], "keep_session": True,
                                       "by": {"experiment": exp.id, "registry": rid, "clone": clone(settings)}}))
        keys.insert(at, "halt")
    timeout = settings.ssh.command_timeout + settings.run.stop_timeout + settings.run.term_timeout
    # the node journals each step in its run folder: a launch orch never hears back from is settled from it
    journal = {"exp_id": exp.id, "registry": key, "project": settings.project.name}
    try:
        values = client.call(ops, lock=settings.run.lock_timeout, what=f"start node {node.rank}", timeout=timeout,
                             journal=journal)
    except OrchError as exc:  # the checkpoints moved before the failure: say where they are
        done = dict(zip(keys, exc.partial or []))
        node.trash = done.get("trash")
        node.stopped = _stopped_by(done)
        raise
    done = dict(zip(keys, values))
    node.trash = done.get("trash")
    node.stopped = _stopped_by(done)
    node.shell = [v for k, v in zip(keys, values) if k == "shell"]
    return done.get("verify", {"state": "running"}) | {"run_dir": (done.get("start") or {}).get("run_dir")}


def _stopped_by(done: dict) -> list:
    """The runs a node's start call stopped: its part of the job replaced, then the project's other runs."""
    return [r for k in ("halt", "stop") for r in (done.get(k) or {}).get("stopped") or []]


def _record_stopped(project: str, registry: Registry, nodes: list[Node], by: int) -> list[dict]:
    """The runs the nodes' starts stopped, recorded as stopped by experiment ``by``: a single-target row
    directly, another job's row through that node's record (settled once all its nodes are)."""
    from ..records.reconcile import belongs

    out = []
    for node in nodes:
        for run in node.stopped:
            mine = registry.owns(run)
            out.append({"id": run.get("id"), "state": run.get("state"), "exit_code": run.get("exit_code"),
                        "node": node.rank, "label": node.target.label, "mine": mine, "clone": run.get("clone")})
            if not mine:
                continue
            try:
                old = registry.get(int(run["id"]))
            except (OrchError, TypeError, ValueError):
                continue
            ended = run.get("ended") or time.time()
            why = f"stopped by experiment {by}"
            if old.nodes:
                _stop_node_of(registry, old, node.target.machine, run, ended, why)
            elif belongs(old, node.target, project):
                registry.update(old.id, status=run.get("state") or "stopped", exit_code=run.get("exit_code"),
                                ended=ended, end_reason=why)
    return out


def _stop_node_of(registry: Registry, old: Experiment, machine: str, run: dict, ended: float, why: str) -> None:
    """Another job lost its node on ``machine`` to a new launch: that node's record says so."""
    records = [dict(r) for r in old.nodes or []]
    for rec in records:
        if rec.get("machine") == machine:
            rec.update(state=run.get("state") or "stopped", exit_code=run.get("exit_code"), ended=ended,
                       reason=why, reachable=True)
    done = job_settle.settle(records)
    registry.update(old.id, nodes=records, **({**done, "ended": done["ended"] or ended} if done else {}))


def _node_recovery(settings, run: distributed.NodeRun, key: str | None) -> dict:
    """Each node's supervisor watches for stalls of the job (no node moving: its peers tell it over UDP);
    restarts are the launcher's (``[run] restarts``, torchrun's): one node relaunched alone would wait for a
    rendezvous that has gone."""
    job = {**run.job, "id": f"{run.job['id']}/{key or ''}"} if run.job else None
    return {**settings.run.recovery(), "restarts": 0, "resume_after_reboot": False, "job": job}


def _stop_everywhere(nodes: list[Node], exp_id: int, key: str | None) -> list[tuple[Node, OrchError]]:
    """A failed start's part stopped on every node, those whose start failed too: a start whose answer was lost (its
    agent killed, the link cut) may have started the run all the same, and where nothing started there is nothing
    to stop. Each node keeps the error of its start; the nodes that could not be stopped, with why, are returned."""
    unstopped: dict[int, OrchError] = {}

    def stop(node: Node) -> None:
        try:
            _stop_one(node, exp_id, key)
        except OrchError as exc:
            unstopped[node.rank] = exc

    _parallel(stop, nodes)
    return [(n, unstopped[n.rank]) for n in nodes if n.rank in unstopped]


def _stop_one(node: Node, exp_id: int, key: str | None) -> dict:
    """SIGTERM to the node's launcher; a node that does not answer within the time a stop takes (reaching it,
    the lock, the grace after SIGTERM) fails, never blocks the others."""
    settings = node.settings
    client = _connect(node)
    timeout = settings.ssh.read_timeout + settings.run.lock_timeout + settings.run.term_timeout + 10
    return client.call([Op("run_stop", {"project": settings.project.name, "ids": [exp_id], "stop_timeout": 0,
                                        "term_timeout": settings.run.term_timeout, "term_first": True,
                                        "registry": key})],
                       lock=settings.run.lock_timeout, what=f"stop node {node.rank}", timeout=timeout)[0]


def _records(nodes: list[Node], runs: list | None, states: list) -> list[dict]:
    out = []
    for i, n in enumerate(nodes):
        st = (states[i] if i < len(states) else None) or {}
        out.append({"rank": n.rank, "target": n.target.name, "ct": n.target.info.get("ct") or n.target.spec.ct,
                    "label": n.target.label, "machine": n.target.machine,
                    "address": n.route.get("address") or address_of(n.target), "interface": n.route.get("interface"),
                    "gpus": len((n.probe.get("preflight") or {}).get("gpus") or []),
                    "argv": runs[i].argv if runs else None, "state": st.get("state"),
                    "exit_code": st.get("exit_code"), "run_dir": st.get("run_dir"),
                    "checkpoints_action": (n.trash or {}).get("action"),
                    "checkpoints_entry": (n.trash or {}).get("entry_path"),
                    **({"env": n.launch.venv["hash"]} if n.launch is not None and n.launch.venv else {}),
                    "error": n.error.message if n.error else None})
    return out


def job(registry: Registry, group: Group) -> Experiment:
    """The group's latest job: the newest row on node 0's machine that has a record for every node."""
    want = [m.machine for m in group.members]
    for exp in registry.newest(machine=group.members[0].machine, limit=50):
        if exp.nodes and [n.get("machine") for n in exp.nodes] == want and exp.status != "failed":
            return exp
    raise NotFoundError(f"no job on {group.label}", hint="start one with orch deploy naming these nodes")


def _current_job(registry: Registry, group: Group) -> Experiment | None:
    try:
        exp = job(registry, group)
    except NotFoundError:
        return None
    return exp if exp.status in ("running", "launching") else None


def _settled(settings, group: Group, registry: Registry, exp: Experiment, answers: list[Node],
             key: str) -> Experiment:
    """Each node's record from what it answered (a node not reached keeps its last known state, marked
    unreachable); the row itself is final only once every node is (``job_settle``)."""
    from ..records.end_reason import describe
    from ..records.experiments import FINAL

    records = [dict(r) for r in exp.nodes or []]
    for node in answers:
        got = node.probe.get(key)
        rec = records[node.rank]
        if node.error is not None:
            rec.update(reachable=False, unreachable=node.error.message)
            continue
        rec.update(reachable=True, unreachable=None)
        if got:
            final = got.get("state") in FINAL
            rec.update(state=got.get("state"), exit_code=got.get("exit_code"), last_line=got.get("last_line"),
                       log_mtime=got.get("log_mtime"), started=got.get("started"), ended=got.get("ended"),
                       reason=got.get("last_reason") or (describe(got, registry.registry_id) if final else None),
                       **progress.node_facts(got))
            if final and rec.get("stop_pending"):
                rec.update(stop_pending=False, stop=None)
        elif node.probe.get("told") is not None:  # an interrupted launch this node never started
            rec.update(state="failed", reason=node.probe["told"], stop_pending=False)
    done = job_settle.settle(records)
    if done is not None:
        return registry.update(exp.id, nodes=records, **{**done, "ended": done["ended"] or exp.ended or time.time()})
    if exp.status in FINAL:  # a row settled before every node had ended: open again until they have
        return registry.update(exp.id, nodes=records, status="running", ended=None, exit_code=None, end_reason=None)
    return registry.update(exp.id, nodes=records)


def _nodes_of(settings, group: Group, read_only: bool = False) -> list[Node]:
    return [Node(rank, tgt, settings, read_only=read_only) for rank, tgt in enumerate(group.members)]


def _halt(settings, group: Group, registry: Registry, exp: Experiment, nodes: list[Node]) -> Experiment:
    """SIGTERM to every node's launcher of ``exp`` at once; each node's state and exit code recorded.

    A node that fails to answer keeps its error (``node.error``)."""
    key = registry.run_registry(exp.id)  # read here: the registry belongs to this thread

    def one(n: Node) -> None:
        got = _stop_one(n, exp.id, key)["stopped"]
        n.probe["halted"] = got[0] if got else _run_on(n, settings, exp.id, key)  # ended already: read how
    _parallel(one, nodes)
    with registry.batch():  # what each node said and the job's settled state: one transaction
        exp = registry.update(exp.id, nodes=_owed(exp.nodes or [], nodes))
        return _settled(settings, group, registry, exp, nodes, "halted")


def _owed(records: list[dict], nodes: list[Node]) -> list[dict]:
    """The records with a stop owed to each node it could not be delivered to (the next command that
    reaches the node delivers it)."""
    out = [dict(r) for r in records]
    for n in nodes:
        if n.error is not None and n.rank < len(out):
            out[n.rank].update(stop_pending=True, stop=f"stop not delivered: unreachable ({n.error.message})")
    return out


def stop(settings, group: Group, registry: Registry) -> Experiment:
    """SIGTERM to every node's launcher at once; each node's state and exit code recorded."""
    exp = job(registry, group)
    nodes = _nodes_of(settings, group)
    try:
        return _halt(settings, group, registry, exp, nodes)
    finally:
        for n in nodes:
            n.close()


def _run_on(node: Node, settings, exp_id: int, key: str | None) -> dict | None:
    """The job's run on ``node`` as that node reports it."""
    got = _connect(node).one("status", project=settings.project.name, ids=[exp_id], registry=key, gpus=False)
    return got["runs"][0] | {"now": got.get("now")} if got["runs"] else None  # ages by the node's own clock


def status(settings, group: Group, registry: Registry) -> tuple[Experiment, list[Node]]:
    """The job and each node's run as the node reports it (all asked at once)."""
    from ..records.reconcile import INTERRUPTED

    exp = job(registry, group)
    key = registry.run_registry(exp.id)  # read here: the registry belongs to this thread
    nodes = _nodes_of(settings, group, read_only=True)
    owed = {r.get("rank") for r in exp.nodes or [] if r.get("stop_pending")}
    orphaned = registry.orphaned(exp)

    def read(n: Node) -> None:
        n.probe["run"] = _run_on(n, settings, exp.id, key)
        if n.rank in owed and (n.probe["run"] or {}).get("state") in ("running", "launching"):
            got = _stop_one(n, exp.id, key)["stopped"]  # the stop orch stop could not deliver then
            n.probe["run"] = got[0] if got else _run_on(n, settings, exp.id, key)
        if orphaned:  # an interrupted launch: what its journal on this node tells (what it stopped, or why not)
            told = _journal_facts(n, exp.id, key)
            n.stopped = told["stopped"]
            n.probe["underway"] = told["underway"]  # its agent still runs the steps (a stop, then the start)
            if n.probe["run"] is None and not told["underway"]:  # interrupted before this node started
                n.probe["told"] = launch_journal.not_started(told, INTERRUPTED)
    try:
        _parallel(read, nodes)
    finally:
        for n in nodes:
            n.close()
    settled = _settled(settings, group, registry, exp, nodes, "run")
    if orphaned and all(n.error is None and not n.probe.get("underway") for n in nodes):
        began = {}
        if settled.status == "launching":  # interrupted once its nodes had started: the job runs
            starts = [r["started"] for r in settled.nodes or [] if r.get("started")]
            began = {"status": "running", "started": min(starts) if starts else time.time()}
        with registry.batch():  # the runs its nodes stopped, recorded as its finished launch would have
            _record_stopped(settings.project.name, registry, nodes, exp.id)
            settled = registry.settle(exp.id, nodes=settled.nodes, **began)  # every node answered: its lock goes
    return settled, nodes


def _journal_facts(node: Node, exp_id: int, key: str | None) -> dict:
    """What an interrupted launch did on ``node``, as the node's launch journal tells."""
    found = _connect(node).one("journal_read", ids=[exp_id], registry=key)
    return launch_journal.facts(found.get(str(exp_id), []))
