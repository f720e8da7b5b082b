"""The first `orch status` and `orch experiments show` after a long log: how soon, and whether the last step is exact.

One project on the built-in local target; a run prints --lines lines (``bench_metrics.make_log``: key=value,
bracketed, JSON and plain lines mixed), then one last ``step=N``, and ends; its supervisor keeps its series as it
goes. Then, each a fresh process (the warm process off): `orch status --no-metrics` (what a status costs
without the metric read, on this machine now), `orch status --json` twice and `orch experiments show --json`, each
timed, with the step it shows against the log's last. Then a warm `orch status`, once the series is read to its
end: with the warm orch process up (what a user's second status is), and the command alone in this process (the
CLI's runner: no process start), each the median of --warm runs. Prints one table; asserts nothing about time.
Run: python benchmarks/bench_status_long.py [--lines 300000 | --mb 100] [--warm 5]
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


def warm(work: Path, runs: int) -> list[tuple[str, float, object]]:
    """The warm statuses' rows, once the series is read to its end (here, in this process, in big reads: a status
    reads it a megabyte at a time)."""
    import statistics

    from typer.testing import CliRunner

    from orchestrator.cli.main import app
    from orchestrator.watch import metrics_view

    def inside() -> tuple[float, dict]:
        begin = time.perf_counter()
        res = CliRunner().invoke(app, ["status", "--json"], prog_name="orch")
        took = time.perf_counter() - begin
        assert res.exit_code == 0, res.output
        return took, json.loads(res.stdout)["summary"]

    here = os.getcwd()
    os.chdir(work)
    os.environ["ORCH_WARM"] = "0"
    chunk, budget = metrics_view.SERIES_CHUNK, metrics_view.SUMMED_BUDGET_S
    metrics_view.SERIES_CHUNK, metrics_view.SUMMED_BUDGET_S = 1 << 25, 600.0
    try:
        for _ in range(20):
            if not any(n.startswith("metrics read up to") for n in inside()[1].get("notes", [])):
                break
        metrics_view.SERIES_CHUNK, metrics_view.SUMMED_BUDGET_S = chunk, budget
        alone = [inside() for _ in range(runs + 1)][1:]
        bare = [CliRunner().invoke(app, ["status", "--json", "--no-metrics"], prog_name="orch") and None
                for _ in range(1)]  # (its imports)
        without = []
        for _ in range(runs):
            begin = time.perf_counter()
            CliRunner().invoke(app, ["status", "--json", "--no-metrics"], prog_name="orch")
            without.append(time.perf_counter() - begin)
    finally:
        metrics_view.SERIES_CHUNK, metrics_view.SUMMED_BUDGET_S = chunk, budget
        os.chdir(here)
    del bare
    env = {k: v for k, v in ENV.items() if k != "ORCH_WARM"}
    warm_orch = [sys.executable, "-m", "orchestrator.main", "status", "--json"]  # (the orch script's: it hands over)
    subprocess.run(warm_orch, cwd=work, env=env, capture_output=True, check=True)  # (it starts the warm process)
    time.sleep(2)
    walls, steps = [], []
    for _ in range(runs):
        begin = time.perf_counter()
        res = subprocess.run(warm_orch, cwd=work, env=env, capture_output=True, text=True, check=True)
        walls.append(time.perf_counter() - begin)
        steps.append(json.loads(res.stdout)["summary"].get("step"))
    return [(f"warm `orch status`, the warm process up (median of {runs})", statistics.median(walls), steps[-1]),
            (f"warm `orch status` in this process (the command alone, median of {runs})",
             statistics.median(t for t, _ in alone), alone[-1][1].get("step")),
            (f"warm `orch status --no-metrics` in this process (median of {runs})", statistics.median(without),
             None)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=300_000)
    ap.add_argument("--mb", type=float, default=0.0, help="a log of about this many MB (in place of --lines)")
    ap.add_argument("--warm", type=int, default=5, help="warm statuses timed (0: none)")
    a = ap.parse_args()
    if a.mb:
        a.lines = int(a.mb * 1e6 / 61)  # (make_log's lines average some 61 bytes)
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
        if a.warm:
            rows += warm(work, a.warm)
    finally:
        from orchestrator.warm import client as warm_client

        os.environ.pop("ORCH_WARM", None)
        warm_client.close()  # (this user's own warm process for this orch: the one the warm statuses started)
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
