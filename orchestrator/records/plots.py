"""Drawing experiments' metric series to an image (``orch experiments plot``), and a search's trials (``orch
sweep plot``).

The only module that imports matplotlib, an optional extra (``plot``, docs/install.md): it is
imported when a plot is drawn, never on the CLI's start-up path.
"""

from __future__ import annotations

import io
from pathlib import Path

from ..errors import InputError, extra_hint
from ..files import atomic_write

METRICS = {"loss": ("loss", "loss"), "throughput": ("tok_s", "throughput (tok/s)")}
STEP_RATE = ("steps_s", "throughput (steps/s)")  # runs whose logs give no token rate


def throughput_series(stored: list[dict]) -> str:
    """``tok_s``, or ``steps_s`` when none of the experiments' logs gave tokens/s and all gave a step rate."""
    if not any("tok_s" in s for s in stored) and stored and all(STEP_RATE[0] in s for s in stored):
        return STEP_RATE[0]
    return "tok_s"


def series_key(metric: str) -> str:
    """The registry series behind a ``--metric`` name: ``loss``, ``throughput`` (tokens/s, else steps/s), or any
    metric name the experiments' logs gave (``val_loss``, ``lr``, ``ppl``: ``orch experiments show`` lists them)."""
    if metric in METRICS:
        return METRICS[metric][0]
    if not metric or not all(c.isalnum() or c in "_./@-" for c in metric):
        raise InputError(f"unknown metric {metric!r}", hint="use loss, throughput, or a metric name that orch "
                         "experiments show lists (e.g. val_loss, lr)")
    return metric


def draw(curves: list[tuple[str, list[tuple[float, float]]]], metric: str, out: Path,
         key: str | None = None) -> Path:
    """Plot one line per (label, points) against the step; write ``out`` atomically (PNG, SVG, PDF).

    ``key`` is the series drawn when it is not the metric's own (``steps_s`` for throughput)."""
    series_key(metric)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    try:
        for label, points in curves:
            ax.plot([p[0] for p in points], [p[1] for p in points], label=label, linewidth=1.2)
        ax.set_xlabel("step")
        ax.set_ylabel(STEP_RATE[1] if key == STEP_RATE[0] else METRICS[metric][1] if metric in METRICS else metric)
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        return _save(fig, Path(out))
    finally:
        plt.close(fig)


def draw_search(coords: dict, out: Path) -> Path:
    """A search's trials: parallel coordinates (one line per trial across its parameters, the objective last;
    pruned trials grey) above a scatter of the objective against each parameter (``orch sweep plot``)."""
    plt = _pyplot()
    names = coords["axes"]
    params = names[:-1]
    fig = plt.figure(figsize=(max(8, 2.2 * len(names)), 7.5), dpi=100)
    try:
        grid = fig.add_gridspec(2, max(1, len(params)), height_ratios=[1.2, 1])
        top = fig.add_subplot(grid[0, :])
        for line in sorted(coords["lines"], key=lambda ln: ln["state"] != "pruned"):  # the kept ones on top
            pruned = line["state"] == "pruned"
            top.plot(range(len(names)), line["y"], color="0.75" if pruned else "tab:blue",
                     linewidth=1.0 if pruned else 1.6, alpha=0.8, zorder=1 if pruned else 2)
        best = coords.get("best")
        if best is not None:
            top.plot(range(len(names)), best["y"], color="tab:red", linewidth=2.4, zorder=3,
                     label=f"best: trial {best['trial']}")
            top.legend(loc="upper right")
        top.set_xticks(range(len(names)), [f"{n}\n[{lo} .. {hi}]" for n, (lo, hi) in zip(names, coords["ticks"])])
        top.set_yticks([])
        for x in range(len(names)):
            top.axvline(x, color="0.3", linewidth=0.8)
        top.set_title(coords["title"])
        for i, name in enumerate(params):
            ax = fig.add_subplot(grid[1, i])
            for state, colour in (("pruned", "0.7"), ("complete", "tab:blue")):
                pts = [(x, y) for x, y, s in coords["scatter"][name] if s == state]
                ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=18, color=colour, label=state)
            if coords["log"].get(name):
                ax.set_xscale("log")
            ax.set_xlabel(name)
            if i == 0:
                ax.set_ylabel(names[-1])
                ax.legend(fontsize=8)
            ax.grid(True, alpha=0.3)
        fig.tight_layout()
        return _save(fig, Path(out))
    finally:
        plt.close(fig)


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise InputError(f"plotting needs matplotlib, which is not installed ({exc})",
                         hint=extra_hint("plot") + ", or pip install matplotlib") from exc
    return plt


def _save(fig, out: Path) -> Path:
    fmt = out.suffix.lstrip(".").lower() or "png"
    try:
        image = io.BytesIO()
        fig.savefig(image, format=fmt)
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(out, image.getvalue())
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise InputError(f"cannot write {out}: {reason}",
                         hint="give a writable --out path ending in .png, .svg or .pdf") from exc
    return out
