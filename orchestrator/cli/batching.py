"""``orch batching``: compare batching strategies on a dataset's lengths and optimize buckets.

Defaults come from the ``[batching]`` table of orch.toml (``load_settings``); flags override them. Library errors
(``ValueError`` from ``orchestrator.batching``) become ``InputError`` here, the one place that
knows about both. numpy, rich tables and matplotlib are imported inside the commands.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import InputError, extra_hint
from .render import print_json

app = typer.Typer(help="Plan batching under a token budget: predict throughput and freshness before launch.",
                  no_args_is_help=True)

LengthsOpt = Annotated[Optional[Path], typer.Option(
    "--lengths", help="Sample lengths: .npy, JSONL or one integer per line (default: batching.lengths).")]
FieldOpt = Annotated[Optional[str], typer.Option("--field", help="JSONL field holding the length (default: length).")]
ConfigOpt = Annotated[Optional[Path], typer.Option("--config", help="orch.toml to use (default: the nearest one).")]

LENGTHS_HINT = ("give a .npy of integers, a text file with one integer per line, or JSONL with a length field"
                " (--field)")


def _settings(ctx: typer.Context, config: Path | None):
    """orch's settings: this command's --config, else orch's global --config, else the nearest orch.toml."""
    from ..config import load_settings

    return load_settings(config or (ctx.obj or {}).get("config"))


def _config(settings, **flags) -> dict:
    from ..batching import normalize

    raw = dict(settings.batching.model_dump())
    raw.update({k: v for k, v in flags.items() if v is not None})
    try:
        return normalize(raw)
    except ValueError as exc:
        raise InputError(str(exc), "fix [batching] in orch.toml or the flag") from None


def _lengths_path(given: Path | None, cfg: dict, settings) -> Path:
    if given is not None:
        return given
    if cfg.get("lengths"):
        path = Path(cfg["lengths"]).expanduser()
        return path if path.is_absolute() else Path(settings.project_dir) / path
    raise InputError("no lengths file given", "pass --lengths FILE or set [batching] lengths in orch.toml")


def _load(path: Path, field: str | None):
    from ..batching import load_lengths

    try:
        return load_lengths(path, field)
    except ValueError as exc:
        raise InputError(str(exc), LENGTHS_HINT) from None


def _library_call(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except ValueError as exc:
        hint = "set [batching] overlong = \"truncate\" or \"drop\"" if "max_seq_len" in str(exc) else \
            "check the lengths file and [batching] in orch.toml"
        raise InputError(str(exc), hint) from None


@app.command()
def plan(
    ctx: typer.Context,
    lengths: LengthsOpt = None,
    field: FieldOpt = None,
    token_budget: Annotated[Optional[int], typer.Option(help="Padded tokens per batch, n * max_len.")] = None,
    max_seq_len: Annotated[Optional[int], typer.Option(help="Longest sample a batch may hold.")] = None,
    window: Annotated[Optional[int], typer.Option(help="G: micro-batches per optimizer step (1: random).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print only JSON on stdout.")] = False,
    plot: Annotated[Optional[Path], typer.Option(help="Write a PNG: lengths, throughput vs freshness.")] = None,
    config: ConfigOpt = None,
) -> None:
    """Compare every strategy on your lengths before launch, and recommend one."""
    from .. import batching
    from ..batching.strategies import prepare

    settings = _settings(ctx, config)
    cfg = _config(settings, token_budget=token_budget, max_seq_len=max_seq_len, window=window)
    path = _lengths_path(lengths, cfg, settings)
    started = time.perf_counter()
    values = _load(path, field)
    load_ms = (time.perf_counter() - started) * 1000
    overlong = _library_call(prepare, values, cfg).overlong
    rows = _library_call(batching.plan, values, cfg)
    plan_ms = (time.perf_counter() - started) * 1000 - load_ms
    if plot is not None:
        _plot(plot, values, rows, cfg)
    if as_json:
        print_json({
            "lengths": str(path), "samples": int(len(values)), "config": cfg, "overlong": overlong,
            "rows": rows, "recommended": next(r["name"] for r in rows if r["recommended"]),
            "load_ms": load_ms, "plan_ms": plan_ms,
        })
        return
    _render(rows, cfg, path, len(values), overlong, load_ms + plan_ms, plot)


def _render(rows, cfg, path, samples, overlong, total_ms, plot) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, title_justify="left", padding=(0, 1, 0, 0), pad_edge=False, header_style="bold underline",
                  title=f"{path.name}: {samples:,} samples, budget {cfg['token_budget']:,}, "
                        f"max_seq_len {cfg['max_seq_len']:,}, G={cfg['window']}")
    table.add_column("strategy", no_wrap=True)
    for header in ("eff", "vs\nsorted", "D1", "D2", "S&L", "batches\n/epoch", "build\nms", ""):
        table.add_column(header, justify="right" if header else "left", no_wrap=True)
    for r in rows:
        note = ", ".join(word for word, on in (("best", r["recommended"]), ("cfg", r["configured"])) if on)
        cells = (r["name"], f"{r['efficiency']:.3f}", f"{r['throughput_vs_sorted']:.1%}", _pct(r["d1"]),
                 f"{r['d2']:.3f}", f"{r['s_and_l']:.0%}", f"{r['batches']:,}", f"{r['build_ms']:.0f}", note)
        table.add_row(*(Text(c) for c in cells), style="bold" if r["recommended"] else None)
    console = Console(highlight=False)
    console.print(table, markup=False)
    best = next(r for r in rows if r["recommended"])
    console.print(f"best: {best['name']}: {best['throughput_vs_sorted']:.1%} of sorted throughput, "
                  f"D1 {_pct(best['d1'])}, S&L {best['s_and_l']:.0%}. In orch.toml: {_setting(best)}", markup=False)
    console.print("vs sorted: throughput predicted from padding; D1: co-batched pairs meeting again next epoch "
                  "(lower is fresher); D2, S&L: length mix per window of G steps; cfg: what orch.toml runs now",
                  style="dim", markup=False)
    auto = next((r for r in rows if r["strategy"] == "megabatch" and r["auto"]), None)
    if auto is not None:
        console.print(f"choosing M={auto['config']['megabatch']} took {auto['choose_ms'] / 1000:.1f} s (once per "
                      f"launch); building an epoch takes {auto['build_ms']:.0f} ms", style="dim")
    if overlong["overlong"]:
        console.print(f"overlong: {overlong['overlong']:,} samples > max_seq_len ({overlong['policy']}: "
                      f"{overlong['truncated']:,} truncated, {overlong['dropped']:,} dropped)", markup=False)
    if plot is not None:
        console.print(f"plot written to {plot}", markup=False)
    console.print(f"planned in {total_ms / 1000:.1f} s", style="dim")


def _setting(row: dict) -> str:
    """The [batching] lines that run ``row``."""
    chosen = row["config"]
    text = f'[batching] strategy = "{chosen["strategy"]}"'
    if chosen["strategy"] == "megabatch":
        text += " (leave megabatch unset: M is chosen from the data at each launch)" if row["auto"] else \
            f", megabatch = {chosen['megabatch']}"
    elif chosen["strategy"] == "bucketed":
        text += f", buckets = {chosen['buckets']}" + (" (orch batching optimize writes them)" if row["auto"] else "")
    return text


def _pct(x: float) -> str:
    return f"{x:.1%}" if x >= 0.01 else f"{x:.3%}"


def _plot(path: Path, values, rows, cfg) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("--plot needs matplotlib, which is not installed", extra_hint("plot")) from None
    import numpy as np

    lens = np.minimum(np.asarray(values), cfg["max_seq_len"])
    fig, (hist, scatter) = plt.subplots(1, 2, figsize=(13, 4.8))
    hist.hist(lens, bins=min(200, max(10, int(np.sqrt(len(lens))))), color="#8aa", log=True)
    styles = {True: ("#c33", "optimized"), False: ("#36c", "configured")}
    for r in rows:
        if r["strategy"] == "bucketed":
            colour, label = styles["optimized" in r["name"]]
            for i, b in enumerate(r["config"]["buckets"][1:-1]):
                hist.axvline(b, color=colour, lw=1, ls="--", label=f"{label} boundaries" if i == 0 else None)
    hist.set(title="sample lengths (tokens)", xlabel="length", ylabel="samples")
    if hist.get_legend_handles_labels()[0]:
        hist.legend()
    for r in rows:
        marker = "*" if r["recommended"] else "o"
        scatter.scatter(max(r["d1"], 1e-6), r["throughput_vs_sorted"], s=140 if r["recommended"] else 50, marker=marker)
        scatter.annotate(r["name"], (max(r["d1"], 1e-6), r["throughput_vs_sorted"]), fontsize=7,
                         xytext=(4, 4), textcoords="offset points")
    scatter.axhline(cfg["target_efficiency"], color="#999", ls=":", lw=1)
    scatter.set(xscale="log", title="throughput vs freshness (lower D1 = fresher)",
                xlabel="D1: co-batched pairs that meet again next epoch", ylabel="throughput vs sorted (from padding)")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc}", "choose a writable path for --plot") from None
    finally:
        plt.close(fig)


@app.command()
def optimize(
    ctx: typer.Context,
    buckets: Annotated[int, typer.Option("--buckets", min=1, help="K: number of buckets.")],
    lengths: LengthsOpt = None,
    field: FieldOpt = None,
    config: ConfigOpt = None,
    write: Annotated[bool, typer.Option("--write/--no-write", help="Write [batching] buckets into orch.toml.")] = True,
) -> None:
    """Find the K bucket boundaries with the least padding (exact DP) and store them in orch.toml."""
    from ..batching import optimal_boundaries, padded_cost, quantile_boundaries
    from ..batching.strategies import prepare

    settings = _settings(ctx, config)
    cfg = _config(settings)
    path = _lengths_path(lengths, cfg, settings)
    values = _load(path, field)
    prepared = _library_call(prepare, values, cfg)
    bounds = _library_call(optimal_boundaries, prepared.length, buckets, cfg["max_seq_len"])
    real = int(prepared.length.sum())
    best = real / padded_cost(prepared.length, bounds)
    baseline = real / padded_cost(prepared.length, quantile_boundaries(prepared.length, buckets, cfg["max_seq_len"]))
    typer.echo(f"buckets = {bounds}")
    typer.echo(f"padding efficiency {best:.3f} (equal-count quantiles: {baseline:.3f})")
    if not write:
        return
    target = settings.config_path
    if target is None:
        raise InputError("no orch.toml to write the buckets into",
                         "pass --config PATH, or --no-write to only print them")
    _write_buckets(Path(target), bounds)
    typer.echo(f"wrote [batching] buckets to {target}")
    if cfg["strategy"] != "bucketed":
        typer.echo(f"note: strategy is {cfg['strategy']!r}; buckets are used with strategy = \"bucketed\"")


def _write_buckets(path: Path, bounds: list[int]) -> None:
    """Set ``[batching] buckets`` keeping the rest of the file (comments included); atomic rename."""
    import tomlkit

    from ..files import atomic_write

    try:
        document = tomlkit.parse(path.read_text(encoding="utf-8")) if path.exists() else tomlkit.document()
    except (OSError, tomlkit.exceptions.TOMLKitError) as exc:
        raise InputError(f"cannot read {path}: {exc}", "fix the file or pass --config PATH") from None
    if "batching" not in document:
        document["batching"] = tomlkit.table()
    document["batching"]["buckets"] = bounds
    atomic_write(path, tomlkit.dumps(document))
