"""`orch status --all` on a project with a long history: its cost must not grow with the experiments recorded.

One project on the built-in local target, a run deployed there; then --rows finished experiments are added to its
registry (as months of deploys leave them) and a run deployed again. In the same run, against the fresh project:
  - the command: `orch status --all` (a fresh process each time), medians of --runs;
  - its registry reads alone, each against how it was read before: the newest row of each machine
    (``Registry.latest_by_place``; before, the newest 500 rows decoded and the first of each machine kept) and a
    machine's latest experiment (``Registry.latest``, from an index of machine and state; before, a query that read
    every row of the machine).
Prints one table; asserts nothing about time.
Run: python benchmarks/bench_history.py [--rows 2000] [--runs 7]
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

from orchestrator.records.experiments import Registry  # noqa: E402


def orch(work: Path, *args: str) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], cwd=work, capture_output=True,
                   text=True, check=True, env={**os.environ, "ORCH_WARM": "0"})
    return (time.perf_counter() - t) * 1000


def status_all_ms(work: Path, runs: int) -> float:
    orch(work, "status", "--all")
    return statistics.median(orch(work, "status", "--all") for _ in range(runs))


def read_ms(db: Path, runs: int) -> dict[str, tuple[float, float]]:
    """Each registry read of the command, as it reads now and as it was read before: medians in ms."""
    def by_window(reg: Registry) -> list:
        latest: dict = {}
        for exp in reg.list(limit=500):
            latest.setdefault(exp.machine or exp.target, exp)
        return [exp for _, exp in sorted(latest.items())]

    def plain_latest(reg: Registry, exp) -> object:
        row = reg.db.execute("SELECT * FROM experiments WHERE (machine = ? OR (machine IS NULL AND target = ?)) AND "
                             "status NOT IN ('failed', 'launching', 'queued') ORDER BY status = 'running' DESC, "
                             "id DESC LIMIT 1", (exp.machine, exp.target)).fetchone()
        return reg._from_row(row)

    def median(read) -> float:
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            read()
            times.append((time.perf_counter() - t) * 1000)
        return statistics.median(times)

    with Registry(db) as reg:
        exp = reg.list(limit=1)[0]
        return {"the newest experiment of each machine (before: the newest 500 rows decoded)":
                (median(lambda: reg.latest_by_place(500)), median(lambda: by_window(reg))),
                "a machine's latest experiment (before: every row of the machine read)":
                (median(lambda: reg.latest(exp.machine, exp.target)), median(lambda: plain_latest(reg, exp)))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=7)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="orch-bench-history-"))
    root = work / "target"
    (work / "train.py").write_text("import time\nprint('step 1 loss 2.0', flush=True)\ntime.sleep(600)\n")
    (work / "orch.toml").write_text(
        f'[project]\nname = "history"\nsources = ["train.py"]\ncommand = "python3 train.py"\n'
        f'[run]\nstop_timeout = 2\n[targets.local]\nkind = "local"\nroot = "{root}"\n'
        f'checkpoints = "{root}/checkpoints"\n')
    db = work / ".orch" / "experiments.db"
    try:
        orch(work, "deploy")
        fresh = status_all_ms(work, a.runs)
        fresh_read = read_ms(db, a.runs)
        with Registry(db) as reg:
            first = reg.get(1)
            with reg.batch():
                for i in range(a.rows):
                    reg.create(project=first.project, target=first.target, target_info=first.target_info,
                               machine=first.machine, revision=first.revision, command=first.command,
                               config=first.config, status="finished", exit_code=0, started=first.created,
                               ended=first.created + 60, message=f"run {i} of an old sweep")
        orch(work, "deploy")
        long = status_all_ms(work, a.runs)
        long_read = read_ms(db, a.runs)
    finally:
        subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "stop"], cwd=work, capture_output=True,
                       env={**os.environ, "ORCH_WARM": "0"})
        subprocess.run(["tmux", "-L", f"orch-{__import__('hashlib').sha256(str(root).encode()).hexdigest()[:8]}",
                        "kill-server"], capture_output=True)
    print(f"\nstatus --all on the local target; medians of {a.runs}")
    print(f"| what | 1 experiment | {a.rows + 2} experiments | ratio |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| orch status --all (a fresh process) | {fresh:.0f} ms | {long:.0f} ms | {long / fresh:.2f}x |")
    for what, (now, before) in long_read.items():
        was_now, was_before = fresh_read[what]
        print(f"| {what}: now | {was_now:.2f} ms | {now:.2f} ms | {now / was_now:.2f}x |")
        print(f"| {what}: before | {was_before:.2f} ms | {before:.2f} ms | {before / was_before:.2f}x |")
    for what, (now, before) in long_read.items():
        print(f"with {a.rows + 2} experiments, {what.split(' (')[0]}: before / now = {before / now:.0f}x")

if __name__ == "__main__":
    main()
