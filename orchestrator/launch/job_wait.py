"""``deploy --wait`` of a job: every node's log read until the job's first metric line, any node's end, or the time.

A job is one thing: its first metric line may come from any node (the process with global rank 0 need not be
on orch's node 0), and the end of any node ends the wait, a crashed one first, with that node's last lines::

    {"state": "running", "metric": {...}, "line": "step=1 loss=2.3", "node": 0, "seconds": 4.1}
    {"state": "crashed", "exit_code": 1, "node": 1, "label": "CT 201 on pve", "tail": [...], "seconds": 3.4}
"""

from __future__ import annotations

import time

from ..reach.agent_client import decode_log
from .distributed import before_launcher_report
from ..records.end_reason import describe
from ..errors import OrchError
from ..records.experiments import ENDED, Experiment, Registry

POLL_S = 0.25


def wait(launch, group, registry: Registry, exp: Experiment) -> dict:
    """Watch a started job for ``launch.wait`` seconds at most (one connection per node, all read at once)."""
    from . import multinode
    from ..watch.logparse import Parser

    settings = launch.settings
    key = registry.run_registry(exp.id)
    parser = Parser(settings.metrics.patterns or None)
    nodes = multinode._nodes_of(settings, group)
    offsets = {n.rank: 0 for n in nodes}
    pending = {n.rank: b"" for n in nodes}
    begin = time.monotonic()

    def read(node) -> None:
        node.probe["read"] = multinode._connect(node).one(
            "log_read", exp_id=exp.id, registry=key, offset=offsets[node.rank], max_bytes=1 << 20)

    try:
        while True:
            multinode._parallel(read, nodes)
            broken = next((n for n in nodes if n.error is not None), None)
            if broken is not None:
                err: OrchError = broken.error  # type: ignore[assignment]
                raise type(err)(f"node {broken.rank} ({broken.target.label}) while waiting: {err.message}; "
                                f"experiment {exp.id} was started on every node", hint="orch status shows the job")
            first = None
            for node in nodes:
                value = node.probe["read"]
                offsets[node.rank] = value["offset"]
                *lines, pending[node.rank] = (pending[node.rank] + decode_log(value)).split(b"\n")
                for line in lines:
                    text = line.decode("utf-8", "replace")
                    event = parser.parse_line(text)
                    if first is None and event and {"step", "loss", "tok_s"} & set(event):
                        first = {"state": "running", "metric": event, "line": text.strip(), "node": node.rank,
                                 "seconds": round(time.monotonic() - begin, 1)}
            ended = [n for n in nodes if n.probe["read"]["state"].get("state") in ENDED]
            if ended:  # seen in the same read as a first metric line: the end is the news
                return _ended(ended, exp, key, begin)
            if first is not None:
                return first
            if time.monotonic() - begin >= launch.wait:
                return {"state": "running", "metric": None, "seconds": launch.wait}
            time.sleep(POLL_S)
    finally:
        for n in nodes:
            n.close()


def first_to_tell(states: list[tuple[int, dict]]) -> int:
    """Which ended node the wait reports: a crashed (or lost) one before one that finished or was stopped,
    then the one that ended first. ``states``: (rank, run state)."""
    order = {"crashed": 0, "lost": 1, "stopped": 2, "finished": 3}
    return min(states, key=lambda rs: (order.get(rs[1].get("state"), 0), rs[1].get("ended") or 0.0, rs[0]))[0]


def _ended(ended: list, exp: Experiment, key: str | None, begin: float) -> dict:
    from . import multinode

    rank = first_to_tell([(n.rank, n.probe["read"]["state"]) for n in ended])
    node = next(n for n in ended if n.rank == rank)
    state = node.probe["read"]["state"]
    tail = multinode._connect(node).one("log_read", exp_id=exp.id, registry=key, tail_lines=200, max_bytes=64 << 10)
    lines, worker = before_launcher_report(decode_log(tail).decode("utf-8", "replace").rstrip().splitlines())
    return {"state": state["state"], "exit_code": state.get("exit_code"), "worker_exit_code": worker, "node": rank,
            "label": node.target.label, "end_reason": describe(state, key), "tail": lines,
            "seconds": round(time.monotonic() - begin, 1)}
