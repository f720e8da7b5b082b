"""deploy, stop and status of a job over several nodes (``--ct 200 --ct 201`` or a group target)."""

from __future__ import annotations

import shlex

import typer

from . import common, render


def group(settings, names, cts, start: bool, trust: bool, dry_run: bool):
    """The job's nodes, or None for one target; a dry run that cannot reach them still shows the plan."""
    return common.for_plan(lambda **kw: common.group(settings, names, cts, **kw), dry_run=dry_run, start=start,
                           trust=trust, where="the nodes")


def deploy(launch, grp, settings, dry_run: bool, as_json: bool) -> None:
    from ..launch import multinode

    if dry_run:
        from ..errors import TargetError

        nodes = multinode.preview(launch, grp)
        lines = render.plan_lines(multinode.plan(launch, grp))
        failure = getattr(grp, "unasked", None) or next(
            (TargetError(f"node {n['rank']} ({n['target']}): {n['unreachable']}") for n in nodes if n["unreachable"]),
            None)
        if as_json:
            render.print_json({"playbook": launch.book.name, "group": grp.name, "nodes": nodes, "steps": lines,
                               "revision": launch.inputs.revision})
        else:
            render.out(f"plan for {launch.book.name} on {grp.label} (dry run: nothing is changed)")
            for line in lines:
                render.out("  " + line)
            for node in nodes:
                render.out(f"node {node['rank']} ({node['target']}):")
                render.out("  env: " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(node["env"].items())))
                render.out("  run: " + shlex.join(node["argv"]))
                if node["unreachable"]:
                    render.out(f"  unreachable: {node['unreachable']}")
        if failure is not None:  # a plan made without asking every node is not a checked plan: exit 3
            raise common.unasked(failure, grp.label)
        return None
    stopped: list = []
    shell: list = []
    with common.registry(settings) as reg:
        try:
            exp = multinode.deploy(launch, grp, reg, stopped, shell)
        finally:
            _say_stopped(stopped)
        if not as_json:  # --json: in the printed object
            _say_shell(shell)
        common.remember_group(settings, grp)
        waited = _wait(launch, grp, reg, exp) if launch.wait and exp.status == "running" else None
        if waited is not None and waited["state"] != "running":
            exp, _ = multinode.status(settings, grp, reg)  # a node ended: every node's record as it is now
    if as_json:
        render.print_json({"experiment": exp.public(), "group": grp.name, "waited": waited, "shell": shell})
    else:
        _say_deployed(exp, grp, waited)
    if waited is not None and waited["state"] in ("crashed", "lost"):
        for line in waited.get("tail") or []:
            render.say(f"  | {line}")
        worker = f"; its worker exited with {waited['worker_exit_code']}" \
            if waited.get("worker_exit_code") is not None else ""
        render.say(f"error: experiment {exp.id}: node {waited['node']} ({waited['label']}) {waited['state']} "
                   f"(exit code {waited.get('exit_code')}{worker}) {waited['seconds']:g} s after the job started")
        render.say(f"hint: orch logs -e {exp.id} --node {waited['node']} shows its whole log; orch status shows "
                   "every node")
        raise typer.Exit(1)
    return None


def _wait(launch, grp, reg, exp) -> dict:
    from ..launch import job_wait
    from .. import signals
    from ..errors import Interrupted

    try:
        with signals.as_interrupts():
            return job_wait.wait(launch, grp, reg, exp)
    except KeyboardInterrupt as exc:
        how, code = signals.describe(exc)
        raise Interrupted(f"{how} while waiting: experiment {exp.id} was started on every node and goes on",
                          exit_code=code) from None


def _say_stopped(stopped: list) -> None:
    """``stopped experiment 7 on CT 201: stopped (exit -15)``: what the job's start stopped on its nodes."""
    for run in stopped:
        render.say(f"stopped {render.which(run)} on {run['label']} (node {run['node']}): {run['state']} "
                   f"(exit {run['exit_code']})")


def _say_shell(answers: list) -> None:
    """What the playbook's shell steps printed on each node, each line prefixed ``[rank]`` as in orch logs."""
    for sh in answers:
        if sh.get("skipped"):
            render.say(f"warning: shell step skipped: {sh['skipped']} on {sh['label']} (node {sh['node']})")
        for line in (sh.get("stdout") or "").rstrip().splitlines():
            render.out(f"[{sh['node']}] {line}")


def _say_deployed(exp, grp, waited: dict | None) -> None:
    what = "started" if exp.status == "running" else exp.status
    if waited is not None and waited["state"] == "running" and waited.get("metric"):
        what += f"; first metrics after {waited['seconds']:g} s on node {waited['node']}: {waited['line']}"
    elif waited is not None and waited["state"] == "running":
        what += f"; no metric line within {waited['seconds']:g} s (orch logs --follow)"
    elif waited is not None:
        what += f"; node {waited['node']} {waited['state']} after {waited['seconds']:g} s"
    render.out(f"experiment {exp.id}: {what} on {grp.label} (revision {exp.revision})")
    for node in exp.nodes or []:
        moved = {"moved": f"; checkpoints moved to {node.get('checkpoints_entry')}",
                 "purged": "; checkpoints deleted (--purge)"}.get(node.get("checkpoints_action") or "", "")
        render.out(f"  node {node['rank']} {node['label']} {node['address']}: {node['state']}{moved}")


def restart(settings, grp, *, message, clean: bool, purge: bool, yes: bool, confirm, dry_run: bool,
            as_json: bool, parent=None) -> None:
    """Relaunch the job's revision and command on its nodes as a new job (the old one stops first); ``parent``:
    that job (``restart -e ID``), else the nodes' latest."""
    from ..launch import multinode, prepare

    with common.registry(settings) as reg:
        parent = parent or multinode.job(reg, grp)
        launch = prepare.restart(settings, grp.members[0], reg, message=message, clean=clean, purge=purge,
                                 yes=yes, confirm=confirm, echo=render.say, parent=parent)
    launch.wait = False
    return deploy(launch, grp, settings, dry_run, as_json)


def stop(settings, grp, as_json: bool) -> None:
    from ..launch import multinode

    from ..errors import TargetError

    with common.registry(settings) as reg:
        exp = multinode.stop(settings, grp, reg)
    if as_json:
        render.print_json({"experiment": exp.public(), "group": grp.name})
    else:
        render.out(f"experiment {exp.id} on {grp.label}: {exp.status}")
        _node_lines(exp, settings)
    owed = [n for n in exp.nodes or [] if n.get("stop_pending")]
    if owed:
        raise TargetError("; ".join(f"node {n['rank']} ({n['label']}): {n['stop']}" for n in owed),
                          hint="the next orch status (or orch stop) that reaches the node stops it there; "
                               "check the node's container")
    return None


def status(settings, grp, as_json: bool) -> None:
    from ..launch import multinode
    from ..watch.job_progress import summary

    with common.registry(settings) as reg:
        exp, nodes = multinode.status(settings, grp, reg)
    if all(n.error is not None for n in nodes):  # nothing could be read: as for one unreachable target
        first = nodes[0].error
        raise type(first)("; ".join(f"node {n.rank} ({n.target.label}): {n.error.message}" for n in nodes),
                          hint=first.hint)
    if as_json:
        nodes = [{**n, "metrics": _metrics(n, settings)} for n in exp.nodes or []]
        return render.print_json({"experiment": exp.id, "state": exp.status, "group": grp.name,
                                  "exit_code": exp.exit_code, "nodes": nodes,
                                  "progress": summary(exp.nodes or []) if exp.status == "running" else None})
    render.out(f"{grp.name}: experiment {exp.id} {exp.status}" +
               (f" (exit {exp.exit_code})" if exp.exit_code is not None else "") + progress_note(exp, settings))
    _node_lines(exp, settings)
    return None


def _metrics(node: dict, settings) -> dict:
    """The metrics of a node's last log line (step, loss, tok_s, ...), as ``[metrics] patterns`` read them."""
    from ..watch.logparse import Parser

    line = node.get("last_line")
    return (Parser(settings.metrics.patterns or None).parse_line(line) if line else None) or {}


def progress_note(exp, settings) -> str:
    """When a running job last moved (any node), or that no node has: the end of its headline."""
    from ..watch.job_progress import job_note, summary

    return job_note(summary(exp.nodes or []), settings.run.stall_after) if exp.status == "running" else ""


def _node_lines(exp, settings) -> None:
    """One line per node: state, exit code, reason, step and throughput of its last line, its output against
    the job's progress, GPUs."""
    from ..watch.job_progress import node_note, summary

    moved = summary(exp.nodes or []) if exp.status == "running" else None
    for node in exp.nodes or []:
        code = f" (exit {node['exit_code']})" if node.get("exit_code") is not None else ""
        code += f" [{node['reason']}]" if node.get("reason") and node.get("state") != "running" else ""
        reach = "" if node.get("reachable", True) else f" [unreachable: {node.get('unreachable') or 'not reached'}]"
        reach += f" [{node['stop']}]" if node.get("stop_pending") and node.get("stop") else ""
        facts = []
        event = _metrics(node, settings)
        if "step" in event:
            facts.append(f"step {event['step']:g}")
        if "tok_s" in event:
            facts.append(f"{event['tok_s']:,.0f} tok/s")
        if node.get("state") == "running":
            facts += node_note(node, moved, len(exp.nodes or []))
        if node.get("gpus"):
            facts.append(f"{node['gpus']} GPU(s)")
        more = f", {', '.join(facts)}" if facts else ""
        last = f"  | {node['last_line']}" if node.get("last_line") else ""
        render.out(f"  node {node['rank']} {node['label']} {node['address']}: {node['state']}{code}{reach}{more}"
                   f"{last}")


def logs(settings, grp, experiment, *, write, lines: int, follow: bool, node) -> None:
    """Every node's log merged (each line prefixed ``[rank]``), or one node's with ``--node``."""
    from ..launch import multinode
    from ..errors import InputError
    from ..watch.job_logs import follow_nodes

    with common.registry(settings) as reg:
        exp = reg.get(experiment) if experiment is not None else multinode.job(reg, grp)
        key = reg.run_registry(exp.id)
    ranks = range(len(grp.members))
    if node is not None and node not in ranks:
        raise InputError(f"--node {node}: experiment {exp.id} has nodes 0 to {len(grp.members) - 1}",
                         hint="see orch status for the job's nodes")
    targets = {r: grp.members[r] for r in ([node] if node is not None else ranks)}
    where = grp.label if node is None else f"node {node} ({grp.members[node].label})"
    if follow:
        render.say(f"orch: following experiment {exp.id} on {where} (Ctrl-C stops following, not the run)")
    try:
        nodes = follow_nodes(settings, targets, exp.id, write=write, notice=lambda m: render.say(f"orch: {m}"),
                             follow=follow, tail_lines=lines, registry=key, prefix=node is None)
    except KeyboardInterrupt:
        import typer

        render.say("orch: stopped following (the run goes on)")
        raise typer.Exit(0) from None
    failed = [n for n in nodes if n.error is not None]
    if follow and not failed:
        with common.registry(settings) as reg:
            if experiment is None:  # the latest job: settle its row from every node's record
                exp, _ = multinode.status(settings, grp, reg)
            else:
                exp = reg.get(exp.id)
        codes = ", ".join(f"node {n['rank']}: {n.get('exit_code')}" for n in exp.nodes or [])
        render.say(f"orch: experiment {exp.id} {exp.status} (exit codes {codes})")
    if failed:
        raise failed[0].error
