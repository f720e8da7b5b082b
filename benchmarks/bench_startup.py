"""Start-up cost of the CLI: `orch --help` and `orch status` against `python -c pass` (medians, ratios).

Run: python benchmarks/bench_startup.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def median_ms(argv: list[str], runs: int, cwd: str) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(argv, cwd=cwd, capture_output=True, check=False)
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="orch-bench-"))
    shutil.copy(REPO / "examples" / "tinylm" / "train.py", work / "train.py")
    (work / "orch.toml").write_text(
        f'[project]\nname = "bench"\nsources = ["train.py"]\n[targets.local]\nkind = "local"\n'
        f'root = "{work}/target"\ncheckpoints = "{work}/target/checkpoints"\n')
    orch = [sys.executable, "-m", "orchestrator.cli.main"]
    env_cwd = str(work)
    base = median_ms([sys.executable, "-c", "pass"], args.runs, env_cwd)
    rows = [("python -c pass", base)]
    rows.append(("orch --help", median_ms([*orch, "--help"], args.runs, env_cwd)))
    rows.append(("orch experiments list", median_ms([*orch, "experiments", "list"], args.runs, env_cwd)))
    rows.append(("orch status (local agent call)", median_ms([*orch, "status"], args.runs, env_cwd)))
    heavy = subprocess.run([*orch[:1], "-c", "import sys, orchestrator.cli.main as m; "
                            "print(sorted(n for n in ('fabric','paramiko','proxmoxer','requests','libtmux','numpy',"
                            "'pydantic','rich') if n in sys.modules))"], capture_output=True, text=True, cwd=REPO)
    print(f"{'command':34} {'median ms':>10} {'x python':>9}")
    for name, ms in rows:
        print(f"{name:34} {ms:10.1f} {ms / base:9.1f}")
    print(f"heavy modules loaded by `import orchestrator.cli.main`: {heavy.stdout.strip() or heavy.stderr.strip()}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
