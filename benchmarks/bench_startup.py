"""Start-up cost of the CLI: `orch --help`, `orch status` and deploys on the local target, against `python -c pass`.

Everything runs as a real subprocess from a project folder whose local target holds one live run. Prints
medians and ratios (the bar for `orch --help` is 3x `python -c pass`), the time the target spent in the start
check (`run_verify`), and which heavy modules each command loaded. Asserts nothing about time.

Bytecode caching is on, as for an installed orch (PYTHONDONTWRITEBYTECODE would make every run compile orch
and the agent from source); one warm-up run precedes each measured series.
Run: python benchmarks/bench_startup.py [--runs N]
"""

from __future__ import annotations

import argparse
import json
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
HEAVY = ("paramiko", "invoke", "cryptography", "proxmoxer", "requests", "numpy", "rich", "pydantic",
         "yaml", "sqlite3")
TRAIN = "import time\nfor i in range(10 ** 6):\n    print(f'step={i} loss={1 / (i + 1):.4f}', flush=True)\n" \
        "    time.sleep(0.5)\n"
# like the `orch` script, plus a note of the heavy modules loaded, written at exit
WRAPPER = ("import atexit, json, os, sys\n"
           "atexit.register(lambda: open(os.environ['BENCH_MODULES'], 'w').write(json.dumps(sorted("
           "{m.split('.')[0] for m in sys.modules} & set(%r)))))\n"
           "from orchestrator.cli.main import main\nmain(sys.argv[1:])\n" % (HEAVY,))


def median_ms(argv: list[str], runs: int, cwd: Path, env: dict, before=None) -> tuple[float, float]:
    """Medians of wall time and of CPU time (user + system, with every child waited for): CPU time
    hardly moves when other work shares the machine, wall time does."""
    times, cpu = [], []
    for i in range(runs + 1):  # the first is a warm-up (bytecode, page cache)
        if before:
            before(i)
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        subprocess.run(argv, cwd=cwd, capture_output=True, check=False, env=env)
        wall = (time.perf_counter() - t) * 1000
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if i:
            times.append(wall)
            cpu.append((after.ru_utime + after.ru_stime - used.ru_utime - used.ru_stime) * 1000)
    return statistics.median(times), statistics.median(cpu)


def heavy_of(args: list[str], cwd: Path, env: dict) -> str:
    note = cwd / ".bench-modules.json"
    subprocess.run([sys.executable, "-c", WRAPPER, *args], cwd=cwd, capture_output=True, env=dict(env,
                   BENCH_MODULES=str(note)), check=False)
    return ",".join(json.loads(note.read_text())) or "-"


def verify_ms(orch: list[str], cwd: Path, env: dict, runs: int) -> float:
    """Median time the target spent in `run_verify` during a deploy (from the agent's own timings)."""
    code = ("import sys; sys.argv = ['orch', 'deploy', '--json']\n"
            "import orchestrator.reach.agent_client as ac\n"
            "orig = ac.AgentClient.call\n"
            "def call(self, ops, **kw):\n"
            "    out = orig(self, ops, **kw)\n"
            "    if 'run_verify' in self.timings: sys.stderr.write('VERIFY %f\\n' % self.timings['run_verify'])\n"
            "    return out\n"
            "ac.AgentClient.call = call\n"
            "from orchestrator.cli.main import main\nmain()\n")
    out = []
    for _ in range(runs):
        res = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, env=env)
        out += [float(line.split()[1]) for line in res.stderr.splitlines() if line.startswith("VERIFY ")]
    return statistics.median(out) if out else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="orch-bench-"))
    (work / "train.py").write_text(TRAIN)
    root = work / "target"
    (work / "orch.toml").write_text(
        f'[project]\nname = "bench"\nsources = ["train.py"]\ncommand = "python3 train.py"\n[run]\nstop_timeout = 2\n'
        f'[targets.local]\nkind = "local"\nroot = "{root}"\ncheckpoints = "{root}/checkpoints"\n')
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    orch = [sys.executable, "-m", "orchestrator.cli.main"]
    subprocess.run([*orch, "deploy"], cwd=work, capture_output=True, check=True, env=env)

    def one_line_change(i: int) -> None:
        (work / "train.py").write_text(TRAIN + f"# change {i} {time.time()}\n")

    base = median_ms([sys.executable, "-c", "pass"], args.runs, work, env)
    cases = [("orch --help", ["--help"], None, args.runs),
             ("orch status (local, live run)", ["status"], None, args.runs),
             ("orch deploy --dry-run (local)", ["deploy", "--dry-run"], one_line_change, args.runs),
             ("orch deploy (local, one-line change)", ["deploy"], one_line_change, max(3, args.runs // 3))]
    rows = [("python -c pass", *base, "-")]
    for name, argv, before, runs in cases:
        rows.append((name, *median_ms([*orch, *argv], runs, work, env, before), heavy_of(argv, work, env)))
    verify = verify_ms(orch, work, env, max(3, args.runs // 3))
    print(f"medians of {args.runs} runs (deploys: {max(3, args.runs // 3)}), bytecode cache on, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'command':38} {'wall ms':>8} {'x python':>9} {'CPU ms':>8} {'x python':>9}  heavy modules loaded")
    for name, ms, cpu, heavy in rows:
        print(f"{name:38} {ms:8.1f} {ms / base[0]:9.2f} {cpu:8.1f} {cpu / base[1]:9.2f}  {heavy}")
    print(f"{'  of which run_verify on the target':38} {verify:8.1f}")
    print(f"orch --help vs python -c pass: {rows[1][1] / base[0]:.2f}x wall, {rows[1][2] / base[1]:.2f}x CPU "
          "(bar: 3x)")
    subprocess.run([*orch, "stop"], cwd=work, capture_output=True, env=env)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
