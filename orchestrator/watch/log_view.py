"""What ``orch logs`` reads: which run's log, that log followed to its end, and its bytes as metric lines."""

from __future__ import annotations

from typing import Callable, ContextManager

from ..config import Settings
from ..records.experiments import Experiment, Registry
from ..reach.targets import Target


def find_run(settings: Settings, registry: Registry, experiment: int | None, flags: tuple[str | None, int | None],
             resolve: Callable[[str | None, int | None], Target]) -> tuple[Target, Experiment, str | None]:
    """The target, experiment and run-folder key of the log to read: experiment ``experiment`` (where it ran,
    unless ``flags`` name a target), else the latest on the target the flags name; its rows reconciled first."""
    from ..errors import NotFoundError
    from ..records.reconcile import recover
    from .metrics_view import target_flags

    if experiment is not None and flags == (None, None):
        flags = target_flags(settings, registry.get(experiment))
    tgt = resolve(*flags)
    recover(settings, tgt, registry)
    slurm = tgt.spec.kind == "slurm"  # a job pending for its nodes: its log comes once it runs
    exp = registry.get(experiment) if experiment is not None else \
        registry.latest(tgt.machine, tgt.name, queued=slurm)
    if exp is None:
        raise NotFoundError(f"no experiment on {tgt.label}",
                            hint="orch deploy starts one (or orch use picks the target you deployed to)")
    return tgt, exp, registry.run_registry(exp.id)


def read(settings: Settings, target: Target, exp_id: int, run_registry: str | None,
         open_registry: Callable[[], ContextManager[Registry]], *, write: Callable[[bytes], None],
         notice: Callable[[str], None], follow: bool, tail_lines: int) -> dict:
    """Write the run's log (its last ``tail_lines`` lines first); ``follow``: until the run ends, and then its
    end recorded. Returns the run's state as the agent last reported it."""
    from ..records.reconcile import sync
    from .follow import follow as follow_log

    result = follow_log(settings, target, exp_id, write=write, notice=notice, follow=follow, tail_lines=tail_lines,
                        registry=run_registry)
    if follow and result.state.get("id") == exp_id:
        with open_registry() as reg:
            sync(reg, [result.state], target, settings.project.name)
    return result.state


def read_series(settings: Settings, target: Target, exp_id: int, run_registry: str | None,
                open_registry: Callable[[], ContextManager[Registry]], *, emit: Callable[[dict], None], follow: bool,
                tail_lines: int) -> dict | None:
    """``read`` with ``--metrics`` of a run whose supervisor keeps its series: its events from there
    (``series_logs``); None, having read nothing, where the run keeps none."""
    from ..records.reconcile import sync
    from .series_logs import read as read_kept

    state = read_kept(settings, target, exp_id, run_registry, emit=emit, follow=follow, tail_lines=tail_lines)
    if follow and state is not None and state.get("id") == exp_id:
        with open_registry() as reg:
            sync(reg, [state], target, settings.project.name)
    return state


def job_nodes(target: Target, exp: Experiment) -> int:
    """How many nodes the run's Slurm job has (each with its own log); 1 for any other run."""
    if target.spec.kind != "slurm":
        return 1
    count = ((exp.target_info or {}).get("slurm") or {}).get("nodes")
    return count if isinstance(count, int) and count > 1 else 1


def read_nodes(settings: Settings, target: Target, exp: Experiment, run_registry: str | None,
               open_registry: Callable[[], ContextManager[Registry]], *, write: Callable[[bytes], None],
               notice: Callable[[str], None], follow: bool, tail_lines: int, node: int | None) -> dict:
    """``read`` for a Slurm job over several nodes: every node's log merged, each line prefixed ``[rank]`` as for
    a job over CTs (``job_logs``), or node ``node``'s alone; all read through the login node from the shared
    file system. Returns the run's state as the agent last reported it."""
    from ..errors import InputError
    from ..records.reconcile import sync
    from .job_logs import follow_nodes

    count = job_nodes(target, exp)
    if node is not None and node >= count:
        raise InputError(f"--node {node}: experiment {exp.id} has nodes 0 to {count - 1}",
                         hint="see orch status for the job's nodes")
    ranks = [node] if node is not None else list(range(count))
    nodes = follow_nodes(settings, {rank: target for rank in ranks}, exp.id, write=write, notice=notice,
                         follow=follow, tail_lines=tail_lines, registry=run_registry, prefix=node is None, folders=True)
    failed = [n for n in nodes if n.error is not None]
    if failed:
        raise failed[0].error
    state = nodes[0].state
    if follow and state.get("id") == exp.id:
        with open_registry() as reg:
            sync(reg, [state], target, settings.project.name)
    return state


def _json_line(event: dict) -> str:
    import json
    import math

    return json.dumps({k: (v if math.isfinite(v) else str(v)) for k, v in event.items()})


class MetricLines:
    """Log bytes in, one ``emit`` per metric event out (``step=10  loss=2.31``, or a JSON object with ``as_json``; a
    progress bar's ``\\r`` updates each count); it counts the lines, to say when none of them held a metric."""

    def __init__(self, patterns: list | None, emit: Callable[[str], None], as_json: bool = False) -> None:
        from .logparse import Parser

        self.parser = Parser(patterns or None)
        self.patterns = patterns
        self.sample: list[str] = []
        self.emit = emit
        self.as_json = as_json
        self.buf = bytearray()
        self.lines = self.events = 0

    def __call__(self, data: bytes) -> None:
        self.buf.extend(data)
        cut = max(self.buf.rfind(b"\n"), self.buf.rfind(b"\r")) + 1
        if cut:
            self._lines(bytes(self.buf[:cut]))
            del self.buf[:cut]

    def _lines(self, data: bytes) -> None:
        for line in data.decode("utf-8", "replace").replace("\r\n", "\n").split("\n"):
            if not line.strip():
                continue
            self.lines += 1
            if not self.events and len(self.sample) < 50:
                self.sample.append(line[:300])
            for ev in self.parser.events(line):
                self.event(ev)

    def event(self, ev: dict) -> None:
        """Print one event (the run's series gives them read already: ``series_logs``)."""
        self.events += 1
        ev = {k: float(v) for k, v in ev.items()}  # (the series keeps a whole number as an int: printed alike)
        self.emit(_json_line(ev) if self.as_json else "  ".join(f"{k}={v:g}" for k, v in ev.items()))

    def finish(self) -> str | None:
        """The rest of the log (its unterminated last line); then the note to give when no line held a metric
        (the log was read; it just holds no metric orch knows), else None."""
        if self.buf:
            self._lines(bytes(self.buf))
            self.buf.clear()
        if self.lines and not self.events:
            from .metrics_view import no_metrics_note

            return no_metrics_note(self.lines, self.sample, self.patterns or None)
        return None
