"""`orch status --all` and `orch deploy` on a project with a long history: their cost must not grow with the
experiments recorded, nor with the run folders the target keeps.

One project on the built-in local target, a run deployed there; then --rows finished experiments are added to its
registry and as many finished run folders to the target (as months of deploys leave them), and a run deployed
again. In the same run, against the fresh project:
  - the commands: `orch status --all` and `orch deploy` (a fresh process each time), medians of --runs;
  - the registry's reads alone, each against how it was read before: the newest row of each machine
    (``Registry.latest_by_place``; before, the newest 500 rows decoded and the first of each machine kept) and a
    machine's latest experiment (``Registry.latest``, from an index of machine and state; before, a query that read
    every row of the machine);
  - the agent's lookups over the run folders alone, each against reading every folder's state (as before): the
    project's live runs (every launch asks, several times) and its newest 20 runs (every status and probe).
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


def median_ms(read, runs: int, first=None) -> float:
    """The median of ``runs`` timed calls of ``read``, each after an untimed ``first``."""
    times = []
    for _ in range(runs):
        if first is not None:
            first()
        t = time.perf_counter()
        read()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


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

    def median(read) -> float:  # each read decodes its rows afresh, as the first read of a command does
        return median_ms(read, runs, first=lambda: reg._decoded.clear())

    with Registry(db) as reg:
        exp = reg.list(limit=1)[0]
        return {"the newest experiment of each machine (before: the newest 500 rows decoded)":
                (median(lambda: reg.latest_by_place(500)), median(lambda: by_window(reg))),
                "a machine's latest experiment (before: every row of the machine read)":
                (median(lambda: reg.latest(exp.machine, exp.target)), median(lambda: plain_latest(reg, exp)))}


def folders_ms(root: Path, runs: int) -> dict[str, tuple[float, float]]:
    """The agent's lookups over the run folders, as they read now and as every folder's state was read before."""
    from orchestrator.agent.run import runs as agent_runs
    from orchestrator.agent.layout import Layout

    layout = Layout(str(root))

    def project_folders() -> list[str]:
        """Every folder's record read for its project, oldest first (how the lookups found them before)."""
        found = []
        for d in (root / "runs").iterdir():
            if (agent_runs.read_json(str(d / "experiment.json"), {}) or {}).get("project") == "history":
                found.append(((d / "experiment.json").stat().st_mtime, str(d)))
        return [d for _, d in sorted(found)]

    def every() -> list[dict]:
        return [agent_runs.run_state(d) for d in project_folders()]

    def median(read) -> float:
        return median_ms(read, runs)

    return {"the project's live runs (before: every folder's state read)":
            (median(lambda: agent_runs.alive_runs(layout, "history")),
             median(lambda: [s for s in every() if s["state"] in ("running", "launching")])),
            "the project's newest 20 runs (before: every folder's record read)":
            (median(lambda: agent_runs.status(layout, "history", tail=False)),
             median(lambda: [agent_runs.run_state(d) for d in project_folders()[-20:]]))}


def old_folders(root: Path, count: int) -> None:
    """``count`` finished run folders of the project, copies of the first run's records, as old deploys leave them."""
    import shutil

    runs_dir = root / "runs"
    first = sorted(runs_dir.iterdir())[0]
    key = first.name.rpartition("-")[0]
    for n in range(10_000, 10_000 + count):
        d = runs_dir / f"{key}-{n}"
        d.mkdir()
        for name in ("experiment.json", "launch.json", "pid.json"):
            if (first / name).exists():
                shutil.copyfile(first / name, d / name)
        (d / "exit.json").write_text('{"exit_code": 0, "ended": 1700000000.0, "signal": null}\n')
        (d / "train.log").write_text("step 1 loss 2.0\n")


def deploy_ms(work: Path, runs: int) -> float:
    times = []
    for i in range(runs):
        (work / "train.py").write_text(TRAIN + f"# {i}\n")
        times.append(orch(work, "deploy"))
    return statistics.median(times)


TRAIN = "import time\nprint('step 1 loss 2.0', flush=True)\ntime.sleep(600)\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=7)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="orch-bench-history-"))
    root = work / "target"
    (work / "train.py").write_text(TRAIN)
    (work / "orch.toml").write_text(
        f'[project]\nname = "history"\nsources = ["train.py"]\ncommand = "python3 train.py"\n'
        f'[run]\nstop_timeout = 2\n[targets.local]\nkind = "local"\nroot = "{root}"\n'
        f'checkpoints = "{root}/checkpoints"\n')
    db = work / ".orch" / "experiments.db"
    try:
        orch(work, "deploy")
        fresh = status_all_ms(work, a.runs)
        fresh_read = read_ms(db, a.runs) | folders_ms(root, a.runs)
        fresh_deploy = deploy_ms(work, a.runs)
        with Registry(db) as reg:
            first = reg.get(1)
            with reg.batch():
                for i in range(a.rows):
                    reg.create(project=first.project, target=first.target, target_info=first.target_info,
                               machine=first.machine, revision=first.revision, command=first.command,
                               config=first.config, status="finished", exit_code=0, started=first.created,
                               ended=first.created + 60, message=f"run {i} of an old sweep")
        old_folders(root, a.rows)
        orch(work, "deploy")
        long = status_all_ms(work, a.runs)
        long_read = read_ms(db, a.runs) | folders_ms(root, a.runs)
        long_deploy = deploy_ms(work, a.runs)
    finally:
        subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "stop"], cwd=work, capture_output=True,
                       env={**os.environ, "ORCH_WARM": "0"})
        subprocess.run(["tmux", "-L", f"orch-{__import__('hashlib').sha256(str(root).encode()).hexdigest()[:8]}",
                        "kill-server"], capture_output=True)
    print(f"\nthe local target; medians of {a.runs}; a fresh project against one with {a.rows} more experiments "
          "and run folders")
    print(f"| what | fresh | {a.rows} more | ratio |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| orch status --all (a fresh process) | {fresh:.0f} ms | {long:.0f} ms | {long / fresh:.2f}x |")
    print(f"| orch deploy of a one-line change (a fresh process) | {fresh_deploy:.0f} ms | {long_deploy:.0f} ms | "
          f"{long_deploy / fresh_deploy:.2f}x |")
    for what, (now, before) in long_read.items():
        was_now, was_before = fresh_read[what]
        print(f"| {what}: now | {was_now:.2f} ms | {now:.2f} ms | {now / was_now:.2f}x |")
        print(f"| {what}: before | {was_before:.2f} ms | {before:.2f} ms | {before / was_before:.2f}x |")
    for what, (now, before) in long_read.items():
        print(f"with {a.rows} more, {what.split(' (')[0]}: before / now = {before / now:.0f}x")

if __name__ == "__main__":
    main()
