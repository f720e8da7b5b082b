"""Deploy latency and bytes written on the local target: first, unchanged and one-file-changed revisions.

Baseline in the same run: the hand-typed local equivalent (copy the tree, kill and recreate the tmux
session). Prints medians and ratios; asserts nothing about time.
Run: python benchmarks/bench_deploy_local.py [--files N] [--mb M] [--runs R]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def orch(work: Path, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], cwd=work, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout) if "--json" in args else {}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=200)
    ap.add_argument("--mb", type=float, default=20.0)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="orch-bench-"))
    src = work / "src"
    src.mkdir()
    per = int(a.mb * (1 << 20) / a.files)
    for i in range(a.files):
        (src / f"f{i:04d}.bin").write_bytes(hashlib.sha256(str(i).encode()).digest() * (per // 32))
    (src / "train.py").write_text("import time\ntime.sleep(600)\n")
    root = work / "target"
    (work / "orch.toml").write_text(
        f'[project]\nname = "bench"\nsources = ["src"]\ncommand = "python3 src/train.py"\n'
        f'[run]\nstop_timeout = 2\n[targets.local]\nkind = "local"\nroot = "{root}"\n'
        f'checkpoints = "{root}/checkpoints"\n')
    rows = []

    def timed(label: str, prepare=None) -> None:
        times, sent = [], []
        for i in range(a.runs):
            if prepare:
                prepare(i)
            t = time.perf_counter()
            res = orch(work, "deploy", "--json")
            times.append((time.perf_counter() - t) * 1000)
            sent.append((res["pushed"]["missing"], res["pushed"]["bytes"]))
        rows.append((label, statistics.median(times), sent[-1]))

    t = time.perf_counter()
    first = orch(work, "deploy", "--json")
    rows.append(("first deploy (all files)", (time.perf_counter() - t) * 1000,
                 (first["pushed"]["missing"], first["pushed"]["bytes"])))
    timed("unchanged revision")
    timed("one file changed", lambda i: (src / "train.py").write_text(f"import time\n# {i} {time.time()}\n"
                                                                       "time.sleep(600)\n"))
    # the hand-typed baseline: copy the whole tree, kill the session, start a new one
    base_times = []
    dest = work / "by-hand"
    for _ in range(a.runs):
        t = time.perf_counter()
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(src, dest)
        subprocess.run(["tmux", "-L", "orch-bench-hand", "kill-session", "-t", "train"], capture_output=True)
        subprocess.run(["tmux", "-L", "orch-bench-hand", "new", "-d", "-s", "train", "python3", str(dest / "train.py")],
                       check=True)
        base_times.append((time.perf_counter() - t) * 1000)
    base = statistics.median(base_times)
    print(f"tree: {a.files + 1} files, {a.mb:.0f} MB; medians of {a.runs} runs")
    print(f"{'deploy':28} {'ms':>8} {'x by-hand':>10} {'files sent':>11} {'bytes sent':>12}")
    print(f"{'by hand (cp -r + tmux)':28} {base:8.0f} {1.0:10.2f} {a.files + 1:11d} {'(all)':>12}")
    for label, ms, (n, b) in rows:
        print(f"{label:28} {ms:8.0f} {ms / base:10.2f} {n:11d} {b:12d}")
    print("note: orch's figure includes its graceful stop of the previous run, the record, and a 0.1 s "
          "verify_started wait")
    orch(work, "stop")
    subprocess.run(["tmux", "-L", "orch-bench-hand", "kill-server"], capture_output=True)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
