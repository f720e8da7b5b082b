"""A failed guard's way back on the local target: from the end of the guard window to the parent's first
resumed log line, against the parent's own start (the same command started by a plain tmux session).

Each round deploys code half as fast as the running parent with ``--guard`` (a short window) and reads the
times from the target's files: the new run's last window line, the guard's decision and rollback journal
(``guard.jsonl``), the restored run's start (``pid.json``) and its first line. The bar: the way back within
5 s plus the parent's own start. Prints a table; asserts nothing.

    python benchmarks/bench_guard.py [--rounds 3] [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = """\
import os, sys, time
ck = os.environ["ORCH_CHECKPOINT_DIR"]
step = 0
if os.environ.get("ORCH_RESUME_FROM"):
    step = int(open(os.environ["ORCH_RESUME_FROM"]).read())
print(f"resumed at step {{step}} t={{time.time():.6f}}", flush=True)
last = time.monotonic()
while True:
    step += 1
    time.sleep({sleep})
    now = time.monotonic()
    print(f"step={{step}} loss=2.0 tok_s={{1000 / (now - last):.0f}} t={{time.time():.6f}}", flush=True)
    last = now
    if step % 10 == 0:
        with open(os.path.join(ck, ".tmp"), "w") as fh:
            fh.write(str(step))
        os.replace(os.path.join(ck, ".tmp"), os.path.join(ck, f"ckpt-{{step:06d}}.txt"))
"""


def orch(work: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], cwd=work, capture_output=True,
                          text=True, timeout=300)


def line_time(log: str, prefix: str) -> float:
    for line in log.splitlines():
        if line.startswith(prefix):
            return float(line.rsplit("t=", 1)[1])
    raise SystemExit(f"no line {prefix!r} in the log")


def own_start(work: Path, root: Path) -> float:
    """The parent's own start: its command in a tmux session of its own, to its first line."""
    log = work / "own.log"
    log.unlink(missing_ok=True)
    (root / "checkpoints").mkdir(parents=True, exist_ok=True)
    begin = time.time()
    subprocess.run(["tmux", "-L", "orch-bench-guard-own", "new", "-d", "-s", "own", "sh", "-c",
                    f"ORCH_CHECKPOINT_DIR={root}/own-ckpt python3 {work}/job.py > {log}"], check=True)
    (root / "own-ckpt").mkdir(exist_ok=True)
    while "resumed at step" not in (log.read_text() if log.exists() else ""):
        time.sleep(0.005)
    first = line_time(log.read_text(), "resumed at step")
    subprocess.run(["tmux", "-L", "orch-bench-guard-own", "kill-server"], capture_output=True)
    return first - begin


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="orch-bench-guard-"))
    root = work / "target"
    (work / "orch.toml").write_text(
        f'[project]\nname = "benchguard"\nsources = ["job.py"]\ncommand = "python3 job.py"\n'
        f'[run]\nstop_timeout = 5\nterm_timeout = 3\n[guard]\nsteps = {a.steps}\n'
        f'[targets.local]\nkind = "local"\nroot = "{root}"\ncheckpoints = "{root}/checkpoints"\n')
    job = work / "job.py"
    job.write_text(JOB.format(sleep=0.02))
    res = orch(work, "deploy", "--wait=20")
    assert res.returncode == 0, res.stderr
    rows, own = [], []
    try:
        for n in range(a.rounds):
            job.write_text(JOB.format(sleep=0.02))
            own.append(own_start(work, root))
            time.sleep(1.0)  # the parent has checkpoints
            job.write_text(JOB.format(sleep=0.04))  # half as fast
            res = orch(work, "deploy", "--guard", "--yes", "--wait=120", "--json")
            guarded = json.loads(res.stdout)["experiment"]["id"]
            restored = json.loads(res.stdout)["guard"]["restored"]
            runs = sorted((root / "runs").iterdir())
            key = next(p.name for p in runs if p.name.endswith(f"-{guarded}")).rsplit("-", 1)[0]
            failed_dir, restored_dir = root / "runs" / f"{key}-{guarded}", root / "runs" / f"{key}-{restored}"
            log = (failed_dir / "train.log").read_text()
            first_step = next(int(x.split()[0][5:]) for x in log.splitlines() if x.startswith("step="))
            window_end = line_time(log, f"step={first_step + a.steps - 1} ")
            journal = [json.loads(x) for x in (failed_dir / "guard.jsonl").read_text().splitlines()]
            decided = next(e["t"] for e in journal if e["event"] == "failed")
            begun = next(e["t"] for e in journal if e["event"] == "begin")
            deadline = time.monotonic() + 30
            while "resumed at step" not in (restored_dir / "train.log").read_text() and time.monotonic() < deadline:
                time.sleep(0.01)
            spawned = json.loads((restored_dir / "pid.json").read_text())["started"]
            first_line = line_time((restored_dir / "train.log").read_text(), "resumed at step")
            rows.append({"decide": decided - window_end, "to rollback": begun - decided,
                         "to parent start": spawned - begun, "parent's first line": first_line - spawned,
                         "total": first_line - window_end})
    finally:
        orch(work, "stop")
        shutil.rmtree(work, ignore_errors=True)
    print(f"guard window {a.steps} steps; parent 50 steps/s, new run 25; {a.rounds} rounds")
    cols = ["decide", "to rollback", "to parent start", "parent's first line", "total"]
    print(f"{'round':>5} " + " ".join(f"{c:>20}" for c in cols) + f" {'own start':>10}")
    for i, row in enumerate(rows, 1):
        print(f"{i:>5} " + " ".join(f"{row[c]:>19.3f}s" for c in cols) + f" {own[i - 1]:>9.3f}s")
    total = statistics.median(r["total"] for r in rows)
    mine = statistics.median(own)
    bar = 5.0 + mine
    print(f"median: window end -> parent's first resumed line {total:.2f} s; parent's own start {mine:.2f} s; "
          f"bar {bar:.2f} s: {'PASS' if total <= bar else 'FAIL'} (ratio {total / bar:.2f} of the bar)")


if __name__ == "__main__":
    main()
