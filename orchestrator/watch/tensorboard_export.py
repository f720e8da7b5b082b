"""Experiments as TensorBoard runs: ``orch experiments export --tensorboard DIR``.

The only module that imports tensorboard, an optional extra (``tensorboard``, docs/install.md), and only inside
functions. Each experiment is one run folder, ``DIR/exp-<id>``, of TensorBoard event files that
``tensorboard --logdir DIR`` shows side by side::

    train/loss  train/lr  train/tok_s ...       the training metrics the log gave
    eval/val_loss  eval/test_acc1 ...           an evaluation's, apart (TensorBoard draws a section per prefix)
    summary/summary_loss  summary/mean_loss     a summary line's (end of training, Hugging Face's closing log)

A point's step is the training step the line came at, as the log printed it (an evaluation's: the last training
step before it), and its wall time when the run's supervisor read that line (``watch/series_read.py``: every event
of the series it keeps on the target). A run without one (an older orch's, a run folder collected, ``[metrics]
patterns``) is exported from the registry's series, which keep no time per point: its points have the experiment's
end time (the export's own while it runs), as the MLflow export does.

Exporting again adds only the points after each tag's last step in the folder (read back from its own event
files), in a new event file beside the others: nothing is duplicated, and a folder deleted is written again whole.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from ..errors import InputError, extra_hint
from ..records.experiments import Experiment, Registry

INSTALL_HINT = extra_hint("tensorboard")
SUFFIX = ".orch"  # the event files this export writes end so (TensorBoard reads any events.out.tfevents.*)
SECTIONS = {"train": "train", "eval": "eval", "summary": "summary"}


def _library() -> tuple[Any, Any, Any, Any]:
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError as exc:
        raise InputError(f"exporting to TensorBoard needs the tensorboard library, which is not installed ({exc})",
                         hint=INSTALL_HINT) from exc
    return EventAccumulator, EventFileWriter, event_pb2, summary_pb2


def run_name(exp: Experiment) -> str:
    return f"exp-{exp.id}"


def tagged(stored: dict | None) -> dict[str, list[tuple[int, float]]]:
    """The registry's series as TensorBoard tags (``train/loss``, ``eval/val_loss``) and their (step, value)
    points, one per step (the last value a step had)."""
    from ..agent.metrics.metric_names import kind_of_metric
    from .metrics import series_of

    out: dict[str, list[tuple[int, float]]] = {}
    for name, series in series_of(stored).items():
        by_step: dict[int, float] = {}
        for x, y in series["points"]:
            by_step[int(round(x))] = y
        out[f"{SECTIONS[kind_of_metric(name)]}/{name}"] = sorted(by_step.items())
    return out


def tagged_records(records: list) -> dict[str, list[tuple[int, float, float]]]:
    """A run's series (``[log offset, time, event]`` each) as TensorBoard tags and their (step, value, wall time)
    points (``series_read.points_of``)."""
    from ..agent.metrics.metric_names import kind_of_metric
    from .series_read import points_of

    return {f"{SECTIONS[kind_of_metric(name)]}/{name}": points for name, points in points_of(records).items()}


def _last_steps(accumulator: Any, folder: Path) -> dict[str, int]:
    """Each tag's last step in the event files already in ``folder``."""
    if not folder.is_dir() or not any(folder.glob("events.out.tfevents.*")):
        return {}
    # size_guidance 0: every point (TensorBoard keeps a sample of 10,000 by default); orphans are points
    # written again at lower steps after a restart, and they are kept as written
    acc = accumulator(str(folder), size_guidance={"scalars": 0}, purge_orphaned_data=False)
    acc.Reload()
    return {tag: max(e.step for e in acc.Scalars(tag)) for tag in acc.Tags().get("scalars", [])}


def export(registry: Registry, ids: list[int] | None, folder: Path, *,
           refresh: Callable[[list[Experiment]], None] | None, now: float | None = None,
           series: Callable[[list[Experiment]], dict[int, list]] | None = None) -> dict:
    """Write experiments ``ids`` (default: all) into ``folder`` as TensorBoard runs, only the points each run
    lacks; ``refresh`` brings their metrics up to date first, ``series`` reads the series their supervisors kept
    (``series_read.records_of``; a run it has none of is exported from the registry)."""
    accumulator, writer_class, event_pb2, summary_pb2 = _library()  # before anything is read or written
    if folder.exists() and not folder.is_dir():
        raise InputError(f"{folder} is a file, not a folder", hint="name a folder for --tensorboard (it is made "
                                                                     "when missing)")
    exps = [registry.get(i) for i in dict.fromkeys(ids)] if ids else sorted(registry.list(), key=lambda e: e.id)
    if refresh is not None:
        refresh(exps)
    kept = series(exps) if series is not None else {}
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for exp in (registry.get(e.id) for e in exps):
        run_dir = folder / run_name(exp)
        have = _last_steps(accumulator, run_dir)
        wall = exp.ended or (time.time() if now is None else now)
        if exp.id in kept:
            points = tagged_records(kept[exp.id])
        else:
            points = {tag: [(step, value, wall) for step, value in got]
                      for tag, got in tagged(registry.metrics(exp.id)).items()}
        new = [(tag, step, value, at) for tag, got in points.items()
               for step, value, at in got if step > have.get(tag, -1)]
        if new:
            run_dir.mkdir(exist_ok=True)
            writer = writer_class(str(run_dir), filename_suffix=SUFFIX)
            try:
                for tag, step, value, at in sorted(new, key=lambda p: (p[1], p[0])):
                    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
                    writer.add_event(event_pb2.Event(wall_time=at, step=step, summary=summary))
            finally:
                writer.close()
        rows.append({"experiment": exp.id, "run": run_name(exp), "points": len(new),
                     "tags": sorted({tag for tag, _, _, _ in new})})
    return {"dir": str(folder), "runs": rows}
