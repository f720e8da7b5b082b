"""What the deploy preflight's doctor checks cost, and what a full ``orch doctor`` takes, on the local target.

Baseline in the same run: the same deploy with a playbook that has no ``doctor`` step (interleaved with the
built-in one, so both see the same machine). Prints medians, the ratio and the doctor op's own time on the
target (``stats.agent_ms`` of ``deploy --json``); asserts nothing about time.
Run: python benchmarks/bench_doctor.py [--runs R]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRAIN = "import time\nfor step in range(1000):\n    print(f'step={step} loss=1.0', flush=True)\n    time.sleep(0.05)\n"


def orch(work: Path, *args: str) -> tuple[float, dict]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), XDG_DATA_HOME=str(work.parent / "data"))
    begin = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], cwd=work, capture_output=True,
                         text=True, env=env)
    took = time.perf_counter() - begin
    if out.returncode not in (0, 6):
        raise SystemExit(f"orch {' '.join(args)} failed ({out.returncode}): {out.stderr}")
    return took, json.loads(out.stdout) if "--json" in args else {}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="orch-bench-doctor-")) / "proj"
    work.mkdir()
    orch(work, "init")
    (work / "train.py").write_text(TRAIN)
    orch(work, "init", "--playbooks")
    book = work / "playbooks" / "deploy.yaml"
    with_doctor = book.read_text()
    without = "".join(line for line in with_doctor.splitlines(keepends=True) if "step: doctor" not in line)
    orch(work, "deploy")  # the agent pushed and the revision stored: every timed deploy below is alike
    times: dict[str, list[float]] = {"with the doctor step": [], "without it (baseline)": []}
    doctor_ms: list[float] = []
    for _ in range(a.runs):
        for name, text in (("without it (baseline)", without), ("with the doctor step", with_doctor)):
            book.write_text(text)
            took, out = orch(work, "deploy", "--json")
            times[name].append(took)
            if "doctor" in out["stats"]["agent_ms"]:
                doctor_ms.append(out["stats"]["agent_ms"]["doctor"])
    full = [orch(work, "doctor", "--json")[0] for _ in range(a.runs)]
    orch(work, "stop")
    base = statistics.median(times["without it (baseline)"])
    print(f"{'deploy on the local target':<34} {'median s':>9} {'ratio':>7}")
    for name, values in times.items():
        print(f"{name:<34} {statistics.median(values):>9.3f} {statistics.median(values) / base:>7.3f}")
    print(f"{'the doctor op on the target':<34} {statistics.median(doctor_ms) / 1000:>9.3f}")
    print(f"{'orch doctor (with torch)':<34} {statistics.median(full):>9.3f}")


if __name__ == "__main__":
    main()
