"""A launch never stops some nodes of a job and leaves the others: it is refused before anything changes.

A launch stops this project's runs on the machines it starts on. A run that is one node of a job (its
target's status names the job's nodes) would be stopped alone when the job has a node the launch does not
cover: the job's other nodes would wait for a peer that has gone. ``check`` raises instead, naming the job's
experiment and the command that stops the whole job. A job the launch covers on every node (a job deployed
again over the same nodes) is stopped whole, as before.
"""

from __future__ import annotations

from ..errors import ConflictError


def check(alive: dict[str, list[dict]], labels: dict[str, str], mine: str | None, verb: str) -> None:
    """``alive``: machine -> the live runs its probe found; ``labels``: machine -> how output names it, for the
    machines this launch starts on; ``mine``: this registry's id (another clone's job is named as such)."""
    for machine, runs in alive.items():
        for run in runs:
            nodes = (run.get("job") or {}).get("nodes") or []
            if not nodes or all(n.get("machine") in labels for n in nodes):
                continue
            rank = next((n.get("rank") for n in nodes if n.get("machine") == machine), "?")
            whose = "" if run.get("registry") == mine else " of another clone of this project" + _clone(run)
            flags = " ".join(f"--ct {n['ct']}" if n.get("ct") is not None else f"--target {n.get('target')}"
                             for n in nodes)
            where = ", ".join(str(n.get("label") or n.get("target")) for n in nodes)
            raise ConflictError(
                f"{labels[machine]} runs node {rank} of experiment {run.get('id')}{whose}, a job over {len(nodes)} "
                f"nodes ({where}): this {verb} would stop only that node; nothing was stopped",
                hint=f"stop the whole job first: orch stop {flags}" + (" from that clone" if whose else ""))


def _clone(run: dict) -> str:
    other = run.get("clone") or {}
    return f" ({other.get('host', '?')}, {other.get('path', '?')})" if other else ""
