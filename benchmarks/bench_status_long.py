"""The first `orch status` and `orch experiments show` after a long log: how soon, and whether the last step is exact.

One project on the built-in local target; a run prints --lines lines (``bench_metrics.make_log``: key=value,
bracketed, JSON and plain lines mixed), then one last ``step=N``, and ends; its supervisor keeps its series as it
goes. Then, each a fresh process (the warm process off): `orch status --no-metrics` (what a status costs
without the metric read, on this machine now), `orch status --json` twice and `orch experiments show --json`, each
timed, with the step it shows against the log's last. Prints one table; asserts nothing about time.
Run: python benchmarks/bench_status_long.py [--lines 300000]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_metrics import make_log  # noqa: E402

ENV = {**os.environ, "ORCH_WARM": "0"}
PRINTER = "import sys\nsys.stdout.write(open(sys.argv[1]).read())\n"


def orch(work: Path, *args: str) -> tuple[float, dict]:
    begin = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], cwd=work, capture_output=True,
                         text=True, env=ENV)
    took = time.perf_counter() - begin
    assert res.returncode == 0, res.stdout + res.stderr
    return took, json.loads(res.stdout) if res.stdout.startswith(("{", "[")) else {}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=300_000)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="orch-bench-status-long-"))
    root = work / "target"
    log = work / "lines.txt"
    log.write_text("\n".join(make_log(a.lines)) + f"\nstep={a.lines} loss=0.5\n")
    (work / "printer.py").write_text(PRINTER)
    (work / "orch.toml").write_text(
        f'[project]\nname = "long"\nsources = ["printer.py"]\ncommand = ["python3", "printer.py", "{log}"]\n'
        f'[targets.local]\nkind = "local"\nroot = "{root}"\ncheckpoints = "{root}/checkpoints"\n')
    rows = []
    try:
        subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "deploy", "--wait"], cwd=work, env=ENV,
                       check=True, capture_output=True)
        run = next((root / "runs").iterdir())
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:  # its supervisor reads the log to its end after the run ended
            try:
                if json.loads((run / "metrics.state.json").read_text())["log"] >= (run / "train.log").stat().st_size:
                    break
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.5)
        sizes = {p.name: p.stat().st_size for p in run.iterdir() if p.name in ("train.log", "metrics.jsonl")}
        for what, args in (("`orch status --no-metrics` (the same command without the metric read)",
                            ("status", "--no-metrics", "--json")),
                           ("first `orch status`", ("status", "--json")), ("second `orch status`", ("status", "--json")),
                           ("first `orch experiments show 1`", ("experiments", "show", "1", "--json"))):
            took, data = orch(work, *args)
            summary = data.get("summary") or data.get("metrics") or {}
            rows.append((what, took, summary.get("step")))
    finally:
        subprocess.run(["tmux", "-L", f"orch-{hashlib.sha256(str(root).encode()).hexdigest()[:8]}", "kill-server"],
                       capture_output=True)
    print(f"\n{a.lines + 1} log lines, the run ended: train.log {sizes.get('train.log', 0) / 1e6:.1f} MB, "
          f"metrics.jsonl {sizes.get('metrics.jsonl', 0) / 1e6:.1f} MB; the last step is {a.lines}")
    print("| command | wall | step shown |")
    print("| --- | ---: | ---: |")
    for what, took, step in rows:
        print(f"| {what} | {took * 1000:.0f} ms | {step} |")


if __name__ == "__main__":
    main()
