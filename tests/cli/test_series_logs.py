"""`orch logs --metrics` reads the metric series the run's supervisor kept (`agent/run/series.py`), from the byte
its last read ended at, and prints what reading the log itself prints: the whole log, its last lines, `--json`, a
run followed to its end; a run without a series and `[metrics] patterns` read the log. The real CLI, as a
subprocess, on the local target."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.cli.test_series_status import ended
from tests.conftest import wait_for

# lines of several formats, an evaluation, JSON lines, a progress bar redrawn with \r, noise
TRAIN = """\
import json, os, sys, time
go = os.path.join(os.environ.get("ORCH_RUN_DIR", "."), "go")
def out(i):
    sys.stdout.write(f"step={i} loss={1.0 + 1.0 / i:.6f} tok/s={10000 + i % 7} lr=3.0e-04\\n")
    if i % 7 == 0:
        sys.stdout.write(json.dumps({"step": i, "grad_norm": round(0.5 + i % 5 / 10, 2), "time": 1.7e9 + i}) + "\\n")
    if i % 100 == 0:
        sys.stdout.write(f"eval: loss={2.0 / i:.6f} acc={i / 3000}\\n")
        sys.stdout.write(f"  {i % 50}%|#    | {i % 50}/50 [00:01<00:01, 9.5it/s]\\r {i % 50 + 1}/50 [00:01<00:01]\\n")
    if i % 13 == 0:
        sys.stdout.write("saving checkpoint to out\\n")
for i in range(1, 2001):
    out(i)
sys.stdout.flush()
if os.environ.get("WAIT_FOR_GO"):
    while not os.path.exists(go):
        time.sleep(0.05)
    for i in range(2001, 3001):
        out(i)
"""


def logs(project, *args: str) -> str:
    res = project.run("logs", "--metrics", *args)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_logs_metrics_reads_the_series_and_prints_what_the_log_gives(project):
    (project.path / "train.py").write_text(TRAIN)
    assert project.run("deploy", "--wait").returncode == 0
    ended(project)
    run = project.run_dir(1)
    kept = {args: logs(project, *args) for args in (("-n", "100000"), ("-n", "40"), ("-n", "100000", "--json"))}
    assert kept[("-n", "100000")].count("\n") > 2300 and "acc=" in kept[("-n", "100000")]
    assert 30 < kept[("-n", "40")].count("\n") < 45
    (run / "metrics.jsonl").rename(run / "kept.jsonl")  # no series: the log is read, as for an older run
    for args, text in kept.items():
        assert logs(project, *args) == text, args
    # the series it printed from, not the log: with the log's lines gone, the same events
    (run / "kept.jsonl").rename(run / "metrics.jsonl")
    log = run / "train.log"
    log.write_text(" " * log.stat().st_size)
    assert logs(project, "-n", "100000") == kept[("-n", "100000")]


def test_logs_metrics_follows_the_series_to_the_runs_end(project):
    (project.path / "train.py").write_text(TRAIN)
    project.configure(extra="")
    text = (project.path / "orch.toml").read_text().replace('TINYLM_SAMPLES = "600"',
                                                            'TINYLM_SAMPLES = "600", WAIT_FOR_GO = "1"')
    (project.path / "orch.toml").write_text(text)
    assert project.run("deploy", "--wait").returncode == 0
    run = project.run_dir(1)
    wait_for(lambda: (run / "metrics.jsonl").exists(), what="the first records of the series")
    follower = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "logs", "--metrics", "-f", "-n",
                                 "100000"], cwd=project.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=dict(os.environ))
    try:
        wait_for(lambda: (run / "metrics.state.json").exists(), what="the series' first save")
        (run / "go").touch()
        out, err = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.communicate()
    assert follower.returncode == 0, err
    ended(project)
    assert "step=3000  loss=1.00033" in out
    (run / "metrics.jsonl").rename(run / "kept.jsonl")
    assert out == logs(project, "-n", "100000")


def test_metrics_patterns_read_the_log_for_logs_metrics(project):
    (project.path / "train.py").write_text(TRAIN + "print('gpu mem=3.5G', flush=True)\n")
    project.configure(extra="\n[metrics]\npatterns = { gpu_mem = 'mem=([0-9.]+)G' }\n")
    assert project.run("deploy", "--wait").returncode == 0
    ended(project)
    assert (project.run_dir(1) / "metrics.jsonl").exists()
    out = logs(project, "-n", "5", "--json")
    assert json.loads(out.splitlines()[-1]) == {"gpu_mem": 3.5}
