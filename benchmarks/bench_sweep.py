"""The seed's experiment as one command: tinylm's four batching strategies as a sweep on the local target.

    python benchmarks/bench_sweep.py [--steps 200] [--samples 4000]

Runs ``orch sweep --set batching.strategy=sorted,shuffle,bucketed,megabatch --steps N`` on examples/tinylm
(lognormal sample lengths, declared to the planner as ``[batching] lengths``), waits on the target's files
for the last variant's end, and prints ``orch sweep show``'s table. Then the idle time between variants:
from one variant's recorded end to the next one's first log line, against the baseline measured in the same
run (the same script started by hand: process start to its first line). The bar is <= 2 s; it is printed,
never asserted.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "tinylm"
STRATEGIES = ["sorted", "shuffle", "bucketed", "megabatch"]
BAR_S = 2.0


def orch(work: Path, *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], cwd=work, capture_output=True,
                         text=True)
    if out.returncode != 0:
        raise SystemExit(f"orch {' '.join(args)} failed: {out.stderr}")
    return out.stdout


def first_line_times(runs: Path, seen: dict, stop: threading.Event) -> None:
    """When each run's log first shows a line of the script's own (not orch's)."""
    while not stop.is_set():
        for log in runs.glob("*/train.log"):
            name = log.parent.name
            if name in seen:
                continue
            try:
                lines = log.read_text(errors="replace").splitlines()
            except OSError:
                continue
            if any(line and not line.startswith(("orch:", "[orch]")) for line in lines):
                seen[name] = time.time()
        time.sleep(0.005)


def bare_start(work: Path, env: dict, runs: int = 5) -> float:
    """Median seconds from starting train.py by hand to its first line: the floor of any idle time."""
    times = []
    for _ in range(runs):
        t = time.time()
        proc = subprocess.Popen([sys.executable, "train.py", "--steps", "1"], cwd=work, env=env,
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        proc.stdout.readline()
        times.append(time.time() - t)
        proc.wait()
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--samples", type=int, default=4000)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="orch-bench-sweep-"))
    root = work / "target"
    shutil.copy(EXAMPLE / "train.py", work / "train.py")
    spec = importlib.util.spec_from_file_location("tinylm_train", EXAMPLE / "train.py")
    train = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(train)
    lengths, _, _ = train.make_data(a.samples, 512)
    (work / "lengths.txt").write_text("\n".join(str(int(n)) for n in lengths) + "\n")
    (work / "orch.toml").write_text(
        'default_target = "local"\n'
        f'[project]\nname = "tinylm"\nsources = ["train.py"]\ncommand = "python3 train.py"\n'
        f'env = {{ OMP_NUM_THREADS = "1", TINYLM_SAMPLES = "{a.samples}", TINYLM_STEPS = "100000" }}\n'
        '[batching]\nstrategy = "megabatch"\ntoken_budget = 4096\nmax_seq_len = 512\nseed = 0\n'
        'lengths = "lengths.txt"\n'
        f'[targets.local]\nkind = "local"\nroot = "{root}"\ncheckpoints = "{root}/checkpoints"\n')
    env = dict(os.environ, OMP_NUM_THREADS="1", TINYLM_SAMPLES=str(a.samples), PYTHONPATH=str(REPO))
    floor = bare_start(work, env)

    seen: dict = {}
    stop = threading.Event()
    (root / "runs").mkdir(parents=True, exist_ok=True)
    watcher = threading.Thread(target=first_line_times, args=(root / "runs", seen, stop), daemon=True)
    watcher.start()
    t0 = time.perf_counter()
    launched = json.loads(orch(work, "sweep", "--set", f"batching.strategy={','.join(STRATEGIES)}",
                               "--steps", str(a.steps), "--json"))
    command_s = time.perf_counter() - t0
    ids = [v["id"] for v in launched["variants"]]
    with_registry = subprocess.run([sys.executable, "-c", "import sys; from orchestrator.records.experiments "
                                    "import Registry; print(Registry(sys.argv[1]).registry_id)",
                                    str(work / ".orch" / "experiments.db")], capture_output=True, text=True,
                                   check=True, env=env).stdout.strip()
    dirs = [root / "runs" / f"{with_registry}-{i}" for i in ids]
    deadline = time.time() + 1800
    while not (dirs[-1] / "exit.json").exists():
        if time.time() > deadline:
            raise SystemExit("the last variant did not end within 30 minutes")
        time.sleep(0.05)
    time.sleep(0.2)
    stop.set()
    total_s = time.perf_counter() - t0
    table = json.loads(orch(work, "sweep", "show", launched["sweep"], "--json"))
    print(f"orch sweep --set batching.strategy={','.join(STRATEGIES)} --steps {a.steps} "
          f"(tinylm, {a.samples} samples): queued in {command_s:.1f} s, all {len(ids)} done in {total_s:.1f} s")
    window = table["window"]
    print(f"throughput over steps {window[0]:g}-{window[1]:g}; loss at step {window[1]:g}")
    print(f"{'':5} {'id':>3} {'strategy':10} {'tok/s':>8} {'x best':>7} {'loss':>8} {'efficiency':>10} {'state':9}")
    best = max(v["throughput"] or 0 for v in table["variants"]) or 1.0
    for v in table["variants"]:
        rate = v["throughput"] or 0
        eff = f"{v['efficiency']:.3f}" if v["efficiency"] is not None else "-"
        loss = f"{v['loss']:.4f}" if v["loss"] is not None else "-"
        print(f"{'best' if v['best'] else '':5} {v['id']:>3} {v['settings'].get('batching.strategy', ''):10} "
              f"{rate:>8.0f} {rate / best:>7.2f} {loss:>8} {eff:>10} {v['status']:9}")
    print(f"\nidle between variants: a variant's end -> the next one's first log line "
          f"(baseline: train.py started by hand, start -> first line: {floor:.2f} s)")
    print(f"{'from':>5} {'to':>4} {'idle s':>7} {'x baseline':>10} {'bar <= 2 s':>10} {'orch: end->spawn':>17} "
          f"{'script: spawn->line':>20}")
    gaps = []
    for before, after, i, j in zip(dirs, dirs[1:], ids, ids[1:]):
        ended = json.loads((before / "exit.json").read_text())["ended"]
        first = seen.get(after.name)
        if first is None:
            print(f"{i:>5} {j:>4} {'?':>7}")
            continue
        gaps.append(first - ended)
        spawned = json.loads((after / "pid.json").read_text())["started"]  # when its supervisor spawned it
        print(f"{i:>5} {j:>4} {first - ended:>7.2f} {(first - ended) / floor:>10.1f} "
              f"{'PASS' if first - ended <= BAR_S else 'FAIL':>10} {spawned - ended:>17.2f} {first - spawned:>20.2f}")
    if gaps:
        print(f"median idle {statistics.median(gaps):.2f} s, worst {max(gaps):.2f} s")
    subprocess.run(["tmux", "-L", "orch-" + hashlib.sha256(str(root).encode()).hexdigest()[:8], "kill-server"],
                   capture_output=True)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
