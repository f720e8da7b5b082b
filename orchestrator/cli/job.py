"""deploy, stop and status of a job over several nodes (``--ct 200 --ct 201`` or a group target)."""

from __future__ import annotations

import shlex

from . import common, render


def group(settings, names, cts, start: bool, trust: bool, dry_run: bool):
    """The job's nodes, or None for one target; a dry run that cannot reach them still shows the plan."""
    return common.for_plan(lambda **kw: common.group(settings, names, cts, **kw), dry_run=dry_run, start=start,
                           trust=trust, where="the nodes")


def deploy(launch, grp, settings, dry_run: bool, as_json: bool) -> None:
    from .. import multinode

    if dry_run:
        nodes = multinode.preview(launch, grp)
        if as_json:
            return render.print_json({"playbook": launch.book.name, "group": grp.name, "nodes": nodes,
                                      "revision": launch.inputs.revision})
        render.out(f"plan for {launch.book.name} on {grp.label} (dry run: nothing is changed)")
        for node in nodes:
            render.out(f"node {node['rank']} ({node['target']}):")
            render.out("  env: " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(node["env"].items())))
            render.out("  run: " + shlex.join(node["argv"]))
            if node["unreachable"]:
                render.out(f"  unreachable: {node['unreachable']}")
        return None
    with common.registry(settings) as reg:
        exp = multinode.deploy(launch, grp, reg)
    common.remember_group(settings, grp)
    if as_json:
        return render.print_json({"experiment": exp.public(), "group": grp.name})
    render.out(f"experiment {exp.id}: {'started' if exp.status == 'running' else exp.status} on {grp.label} "
               f"(revision {exp.revision})")
    for node in exp.nodes or []:
        render.out(f"  node {node['rank']} {node['label']} {node['address']}: {node['state']}")
    return None


def stop(settings, grp, as_json: bool) -> None:
    from .. import multinode

    with common.registry(settings) as reg:
        exp = multinode.stop(settings, grp, reg)
    if as_json:
        return render.print_json({"experiment": exp.public(), "group": grp.name})
    render.out(f"experiment {exp.id} on {grp.label}: {exp.status}")
    _node_lines(exp)
    return None


def status(settings, grp, as_json: bool) -> None:
    from .. import multinode

    with common.registry(settings) as reg:
        exp, _ = multinode.status(settings, grp, reg)
    if as_json:
        return render.print_json({"experiment": exp.id, "state": exp.status, "group": grp.name,
                                  "exit_code": exp.exit_code, "nodes": exp.nodes})
    render.out(f"{grp.name}: experiment {exp.id} {exp.status}" +
               (f" (exit {exp.exit_code})" if exp.exit_code is not None else ""))
    _node_lines(exp)
    return None


def _node_lines(exp) -> None:
    for node in exp.nodes or []:
        code = f" (exit {node['exit_code']})" if node.get("exit_code") is not None else ""
        reach = "" if node.get("reachable", True) else " [unreachable]"
        last = f"  | {node['last_line']}" if node.get("last_line") else ""
        render.out(f"  node {node['rank']} {node['label']} {node['address']}: {node['state']}{code}{reach}{last}")
