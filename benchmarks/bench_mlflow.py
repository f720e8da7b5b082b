"""MLflow export and mirror: what they cost, against MLflow's own client doing the same by hand.

A registry of N experiments (each with 512-point loss, tok_s and lr series, like a long run's) is exported with
`orch experiments export --mlflow --no-log --no-refresh` into a fresh SQLite store, then again (nothing new:
every run found by its tags, no point logged twice). The baseline, in the same run, is a plain script that writes
the same runs with `MlflowClient` (create_run + log_batch, the way one would by hand), into its own fresh store.
Then `orch status` on a live local run, with `[mlflow] mirror` off and on. Prints medians, ratios and CPU
times; asserts nothing about time.
Run: python benchmarks/bench_mlflow.py [--experiments N] [--runs R]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
ORCH = [sys.executable, "-m", "orchestrator.cli.main"]
TRAIN = "import time\nfor i in range(10 ** 6):\n    print(f'step={i} loss={1 / (i + 1):.4f} lr=3e-4', flush=True)\n" \
        "    time.sleep(0.2)\n"
BY_HAND = """
import sys, time
from mlflow import MlflowClient
from mlflow.entities import Metric, Param
sys.path.insert(0, sys.argv[3])
from orchestrator.records.experiments import Registry
from orchestrator.watch.metrics import Series
from orchestrator.watch.mlflow_export import params
client = MlflowClient(sys.argv[1])
eid = client.create_experiment("by-hand")
with Registry(sys.argv[2]) as reg:
    for exp in reg.list():
        run = client.create_run(eid, start_time=int(exp.created * 1000), run_name=f"exp {exp.id}")
        ps = [Param(k, v) for k, v in params(exp).items()]
        for i in range(0, len(ps), 100):
            client.log_batch(run.info.run_id, params=ps[i:i + 100])
        now = int(time.time() * 1000)
        ms = [Metric(k, y, now, int(x)) for k, s in reg.metrics(exp.id)["series"].items()
              for x, y in Series.from_dict(s).points()]
        for i in range(0, len(ms), 1000):
            client.log_batch(run.info.run_id, metrics=ms[i:i + 1000])
        client.set_terminated(run.info.run_id, "FINISHED", end_time=int(exp.ended * 1000))
"""


def timed(argv: list[str], cwd: Path, env: dict) -> tuple[float, float]:
    """Wall and CPU (user + system of the child) seconds of one command, which must succeed."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    res = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{res.stderr}")
    return wall, after.ru_utime + after.ru_stime - used.ru_utime - used.ru_stime


def fill(db: Path, n: int) -> None:
    """``n`` finished experiments with full-size series, through the registry's own API."""
    from orchestrator.config import Settings
    from orchestrator.records.experiments import Registry
    from orchestrator.watch.metrics import Series

    config = Settings().model_dump(mode="json")
    with Registry(db) as reg:
        for i in range(n):
            exp = reg.create(project="bench", target="local", revision="ab" * 8, command="python3 train.py",
                             config=config, batching=config["batching"], started=1.0e9 + i, status="running")
            series = {}
            for key, f in (("loss", lambda s: 4 / (1 + s)), ("tok_s", lambda s: 3e4 + s % 7), ("lr", lambda s: 3e-4)):
                s = Series()
                for step in range(20000):
                    s.add(float(step), f(step))
                series[key] = s.to_dict()
            reg.save_metrics(exp.id, 0, series, {"_state": {"complete": True}})
            reg.update(exp.id, status="finished", ended=1.0e9 + i + 60, exit_code=0)


def project(work: Path, name: str, extra: str = "") -> Path:
    folder = work / name
    folder.mkdir()
    (folder / "train.py").write_text(TRAIN)
    root = work / f"{name}-target"
    (folder / "orch.toml").write_text(
        f'[project]\nname = "bench"\nsources = ["train.py"]\ncommand = "python3 train.py"\n[run]\nstop_timeout = 2\n'
        f'[targets.local]\nkind = "local"\nroot = "{root}"\ncheckpoints = "{root}/checkpoints"\n' + extra)
    return folder


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--experiments", type=int, default=20)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    env = dict(os.environ)
    env.pop("MLFLOW_TRACKING_URI", None)
    work = Path(tempfile.mkdtemp(prefix="orch-bench-mlflow-"))
    try:
        exporting = project(work, "export")
        fill(exporting / ".orch" / "experiments.db", args.experiments)
        export = [*ORCH, "experiments", "export", "--mlflow", "--no-log", "--no-refresh"]
        first = timed(export, exporting, env)
        again = [timed(export, exporting, env) for _ in range(args.runs)]
        hand_uri = f"sqlite:///{work / 'by-hand.db'}"
        hand = timed([sys.executable, "-c", BY_HAND, hand_uri, str(exporting / ".orch" / "experiments.db"),
                      str(REPO)], work, env)
        rows = [(f"by hand: MlflowClient, {args.experiments} runs", *hand),
                (f"orch experiments export, {args.experiments} new runs", *first),
                ("orch experiments export again (nothing new)", statistics.median(a[0] for a in again),
                 statistics.median(a[1] for a in again))]
        status = {}
        for mirror in (False, True):
            folder = project(work, f"status-{mirror}", "[mlflow]\nmirror = true\n" if mirror else "")
            timed([*ORCH, "deploy"], folder, env)
            time.sleep(1)
            timed([*ORCH, "status"], folder, env)  # warm-up: the first one makes the store
            samples = []
            for _ in range(args.runs):
                time.sleep(0.5)  # new log lines each time: the metrics change, so the mirror has work
                samples.append(timed([*ORCH, "status"], folder, env))
            subprocess.run([*ORCH, "stop"], cwd=folder, capture_output=True, env=env)
            status[mirror] = (statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples))
        rows += [("orch status, live run, no mirror", *status[False]),
                 ("orch status, live run, [mlflow] mirror = true", *status[True])]
        print(f"{args.experiments} experiments x 3 series x 512 points; medians of {args.runs} where repeated; "
              f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        print(f"{'what':52} {'wall s':>8} {'CPU s':>8}")
        for name, wall, cpu in rows:
            print(f"{name:52} {wall:8.2f} {cpu:8.2f}")
        print(f"export vs by hand: {first[0] / hand[0]:.2f}x wall, {first[1] / hand[1]:.2f}x CPU")
        print(f"export again vs first export: {rows[2][1] / first[0]:.2f}x wall")
        print(f"status with mirror vs without: {status[True][0] / status[False][0]:.2f}x wall, "
              f"+{status[True][0] - status[False][0]:.2f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
