"""`orch experiments list` over a long history: its cost must not grow with the experiments recorded.

Three projects on the built-in local target with 10, 1,000 and 10,000 finished experiments (each with a metric
summary, as status leaves them: ``bench_ui.fill``). For each, medians of --runs, every command a real `orch`
process through this benchmark's own warm process (as a user's second command is):
  - `orch experiments list` (the newest 50, the default page) and `orch experiments list --json`;
  - every experiment: `orch experiments list --limit N` and `--json --limit N`.
Prints one table with the ratio of each to the same command at 10 experiments; the bar is the default page under
100 ms warm at 1,000. Asserts nothing about time.
Run: python benchmarks/bench_listing.py [--runs 7] [--big 10000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_ui import fill  # noqa: E402
from orchestrator.records.experiments import Registry  # noqa: E402

ORCH = str(Path(sys.executable).parent / "orch")


def project(base: Path, rows: int) -> Path:
    work = base / f"p{rows}"
    work.mkdir()
    (work / "train.py").write_text("print('step 1 loss 2.0')\n")
    (work / "orch.toml").write_text(
        f'[project]\nname = "listing"\nsources = ["train.py"]\ncommand = "python3 train.py"\n'
        f'[targets.local]\nkind = "local"\nroot = "{work}/target"\n')
    with Registry(work / ".orch" / "experiments.db") as reg:
        reg.create(project="listing", target="local", target_info={"kind": "local"}, machine="local:bench",
                   revision="0" * 64, revision_files=[["train.py", "0" * 64, 24]], command="python3 train.py",
                   config={"project": {"name": "listing"}}, status="finished", exit_code=0, message="the first")
    fill(work / ".orch" / "experiments.db", rows - 1)
    return work


def median_ms(work: Path, args: list[str], runs: int, env: dict) -> float:
    times = []
    for i in range(runs + 1):  # the first: a warm-up (the page cache, the warm process's first child)
        t = time.perf_counter()
        subprocess.run([ORCH, *args], cwd=work, capture_output=True, check=True, env=env)
        if i:
            times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--big", type=int, default=10_000)
    a = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="orch-bench-listing-"))
    runtime = base / "run"
    runtime.mkdir(mode=0o700)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    sizes = (10, 1000, a.big)
    works = {n: project(base, n) for n in sizes}
    cases = {"experiments list (newest 50)": lambda n: ["experiments", "list"],
             "experiments list --json (newest 50)": lambda n: ["experiments", "list", "--json"],
             "experiments list --limit N (all)": lambda n: ["experiments", "list", "--limit", str(n)],
             "experiments list --json --limit N (all)": lambda n: ["experiments", "list", "--json", "--limit", str(n)]}
    results: dict[str, dict[int, float]] = {}
    try:
        subprocess.run([ORCH, "experiments", "list"], cwd=works[10], capture_output=True, env=env)
        time.sleep(2)  # the warm process that first command starts, loaded
        for what, args in cases.items():
            results[what] = {n: median_ms(works[n], args(n), a.runs if "all" not in what or n < a.big else 3, env)
                             for n in sizes}
    finally:
        subprocess.run([ORCH, "connections", "close"], cwd=works[10], capture_output=True, env=env)
    print(f"\nthe local target, a warm orch process; medians of {a.runs} (3 for every row of {a.big})")
    print(f"| what | {' | '.join(f'{n:,} experiments' for n in sizes)} | {sizes[1]:,} / 10 | {a.big:,} / 10 |")
    print("| --- |" + " ---: |" * (len(sizes) + 2))
    for what, by in results.items():
        print(f"| {what} | {' | '.join(f'{by[n]:.0f} ms' for n in sizes)} | {by[sizes[1]] / by[10]:.2f}x | "
              f"{by[a.big] / by[10]:.2f}x |")


if __name__ == "__main__":
    main()
