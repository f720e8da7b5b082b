"""How fast orch turns training-log lines into metric events.

Generates a 200K-line log (metric lines in three formats mixed with plain noise lines) and a quarter as
many lines in the formats of nanoGPT, Hugging Face, torchtitan and Megatron-LM, and times each parser
configuration in the same run, taking turns: the baseline is ``Parser(fast=False)``, which reads every line in
full as orch's reader did before it kept line templates; a bare ``line.split()`` loop gives the machine's pace.
The reader is timed as the run's supervisor takes it, a chunk's events as columns (``Reader.tables``: numbers
made, no dict per event), and as the dicts of events the controller's callers take (``Parser().parse_lines``).
Checks that every reading gives the same events; prints a table and the ratios; asserts nothing about wall time.

    PYTHONPATH=. python benchmarks/bench_metrics.py [--lines 200000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable

from orchestrator.agent.metrics.metric_lines import Reader
from orchestrator.watch.metrics import Parser, Series, find_spikes


def make_log(n: int, seed: int = 0) -> list[str]:
    """A log whose lines look like real trainers': 80% key=value, 5% JSON, 15% noise."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        r = rng.random()
        loss = 4.0 * 0.9995 ** (i / 10) + rng.gauss(0, 0.02) + 0.8
        if r < 0.6:
            lines.append(f"step={i} loss={loss:.4f} tok/s={rng.randint(10000, 16000)} lr=3.0e-04 epoch={i // 50000}")
        elif r < 0.8:
            lines.append(f"[2026-11-29 09:32:22] step: {i}/1000000 | loss: {loss:.4f} | grad_norm: 0.93 | Ktok/s: 12.1")
        elif r < 0.85:
            lines.append(json.dumps({"step": i, "loss": round(loss, 4), "lr": 3e-4, "time": 1.7e9 + i}))
        else:
            lines.append(rng.choice([
                "WARNING: dataloader worker 3 is slow, consider raising num_workers",
                "Saving checkpoint to checkpoints/ckpt-000120.npz",
                "  File \"train.py\", line 120, in <module>",
                "validation started",
            ]))
    return lines


def make_framework_log(n: int, seed: int = 0) -> list[str]:
    """The lines frameworks print: nanoGPT, Hugging Face (dicts and \\r bar updates), torchtitan (ANSI), Megatron."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        r = rng.random()
        loss = 4.0 * 0.9995 ** (i / 10) + rng.gauss(0, 0.02) + 0.8
        if r < 0.25:
            lines.append(f"iter {i}: loss {loss:.4f}, time {rng.uniform(40, 60):.2f}ms, mfu {rng.uniform(30, 40):.2f}%")
        elif r < 0.4:
            lines.append(f"{{'loss': '{loss:.4g}', 'grad_norm': '0.93', 'learning_rate': '3e-04', 'epoch': '0.5'}}")
        elif r < 0.55:
            lines.append("".join(f"\r{k * 100 // 1000:3d}%|█▌        | {k}/1000 [00:05<01:30,  2.10it/s]"
                                 for k in range(i % 1000, i % 1000 + 3)))
        elif r < 0.7:
            lines.append(f"\x1b[31mstep: {i}  \x1b[32mloss: {loss:7.4f}  \x1b[33mgrad_norm:  1.2345  \x1b[34mmemory:"
                         f" 12.34GiB(15.60%)  \x1b[34mtps: 12,345  \x1b[36mtflops: 101.50  \x1b[35mmfu: 32.41%\x1b[39m")
        elif r < 0.85:
            lines.append(f" [2025-08-01 07:19:50] iteration {i:8d}/ 1000000 | consumed samples: {i * 128:12d} | "
                         f"elapsed time per iteration (ms): 1234.5 | learning rate: 1.0E-04 | "
                         f"global batch size:   128 |"
                         f" lm loss: {loss:.6E} | loss scale: 1.0 | grad norm: 0.930 | number of skipped iterations:"
                         "   0 | number of nan iterations:   0 |")
        else:
            lines.append(rng.choice(["WARNING: dataloader worker 3 is slow, consider raising num_workers",
                                     "saving checkpoint to out", "validation started"]))
    return lines


def timed(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Each function's best CPU time (this process's, so other processes' load moves it less than wall time) over
    ``rounds``, the functions taking turns: a slow spell of the machine falls on all of them alike."""
    best = {name: float("inf") for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.process_time()
            fn()
            best[name] = min(best[name], time.process_time() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    lines = make_log(args.lines)
    frameworks = make_framework_log(args.lines // 4)

    def split() -> None:
        for line in lines:
            line.split()

    # each reading starts from a new parser, as a status does (the templates it learns are kept per process)
    default = Parser()
    events = default.parse_lines(lines)
    if events != Parser(fast=False).parse_lines(lines):
        raise SystemExit("the fast reader and the full reader disagree on this log")
    if [e for table in Reader().tables(lines) for e in table.events()] != events:
        raise SystemExit("the reader's columns and its events disagree on this log")
    losses = [e["loss"] for e in events if "loss" in e]
    patterns = {"loss": r"loss[=:] ?([0-9.]+)", "gpu_mem": r"mem=([0-9.]+)G"}

    def series() -> None:
        s = Series(512)
        for i, v in enumerate(losses):
            s.add(i, v)

    jobs = {
        "line.split()": (split, len(lines)),
        "Parser(fast=False) (baseline)": (lambda: Parser(fast=False).parse_lines(lines), len(lines)),
        "Reader().tables() columns": (lambda: list(Reader().tables(lines)), len(lines)),
        "Parser() defaults (dicts)": (lambda: Parser().parse_lines(lines), len(lines)),
        "Parser(fast=False) frameworks": (lambda: Parser(fast=False).parse_lines(frameworks), len(frameworks)),
        "Parser() framework lines": (lambda: Parser().parse_lines(frameworks), len(frameworks)),
        "Parser() + 2 user regexes": (lambda: Parser(patterns).parse_lines(lines), len(lines)),
        "Series(512).add per loss": (series, len(losses)),
        "find_spikes over all losses": (lambda: find_spikes(losses), len(losses)),
    }
    seconds = timed({name: fn for name, (fn, _) in jobs.items()}, args.rounds)
    rate = {name: jobs[name][1] / seconds[name] for name in jobs}
    base = rate["Parser(fast=False) (baseline)"]
    print(f"{len(lines):,} log lines, {len(events):,} events, {len(losses):,} loss values; best of {args.rounds}\n")
    print(f"{'what':<32} {'items/s':>12} {'cpu s':>9} {'vs split':>9} {'vs baseline':>12}")
    for name, (_, items) in jobs.items():
        print(f"{name:<32} {rate[name]:>12,.0f} {seconds[name]:>9.3f} {rate[name] / rate['line.split()']:>8.2f}x"
              f" {rate[name] / base:>11.2f}x")
    fw = rate["Parser() framework lines"] / rate["Parser(fast=False) frameworks"]
    print(f"\nreader vs baseline: {rate['Reader().tables() columns'] / base:.1f}x on the mixed log as columns"
          f" (the supervisor's series), {rate['Parser() defaults (dicts)'] / base:.1f}x as dicts;"
          f" {fw:.1f}x on framework lines")


if __name__ == "__main__":
    main()
