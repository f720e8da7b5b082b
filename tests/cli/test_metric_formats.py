"""Metrics from what real frameworks print, with no configuration, end to end on the local target.

Each run is a real script in tmux printing a framework's lines (nanoGPT's format; a Hugging Face Trainer log
captured from a real run, replayed with its carriage returns); status, logs --metrics, deploy --wait and
experiments compare are the real CLI.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from tests.conftest import wait_for

LOGS = Path(__file__).resolve().parent.parent / "data" / "logs"

# nanoGPT train.py's logging: print(f"iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms, mfu {...:.2f}%")
NANOGPT = """\
import os, time
go = os.path.join(os.environ["ORCH_RUN_DIR"], "go")
print("tokens per iteration will be: 8,192")
print("number of parameters: 10.65M")
for it in range(30):
    mfu = -100.0 if it < 5 else 1.5
    print(f"iter {it}: loss {4.2 - it * 0.05:.4f}, time {50 + it % 3:.2f}ms, mfu {mfu:.2f}%", flush=True)
    time.sleep(0.02)
print("step 30: train loss 2.7000, val loss 2.8000", flush=True)
while not os.path.exists(go):  # the run goes on until the test lets it end
    time.sleep(0.05)
"""

# replays a Hugging Face Trainer's output, bar updates (\\r) and all, then keeps running
REPLAY = """\
import os, sys, time
go = os.path.join(os.environ["ORCH_RUN_DIR"], "go")
data = open("hf.log", "rb").read()
for i in range(0, len(data), 300):
    sys.stdout.buffer.write(data[i:i + 300]); sys.stdout.flush(); time.sleep(0.01)
sys.stdout.buffer.write(b"\\n"); sys.stdout.flush()
while not os.path.exists(go):
    time.sleep(0.05)
"""

NOISE = """\
for i in range(240):
    print(f"L={1 - i / 1000:.3f} S={i} something happened", flush=True)
"""


def deploy(project, name: str, source: str, *args: str, extra: tuple[str, ...] = ()) -> tuple[int, str]:
    (project.path / name).write_text(source)
    sources = ", ".join(f"'{s}'" for s in (name, *extra))
    res = project.cli("deploy", "--set", f"project.sources=[{sources}]", "--set", f"project.command=python3 {name}",
                      "--clean-checkpoints", "--yes", *args)
    assert res.exit_code == 0, res.output
    return max(e.id for e in project.registry().list(limit=100)), res.output


def status_json(project) -> dict:
    res = project.cli("status", "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_nanogpt_lines_give_status_logs_metrics_and_a_wait_that_ends_at_the_first_metric(project):
    begin = time.monotonic()
    exp_id, out = deploy(project, "train.py", NANOGPT, "--wait=30")
    assert time.monotonic() - begin < 25  # it returned at the first metric line: the run is still going
    assert f"experiment {exp_id}: running" in out and "first metrics after" in out
    assert "iter 0: loss 4.2000" in out
    wait_for(lambda: status_json(project)["summary"].get("step") == 30, what="the eval line at step 30")
    data = status_json(project)
    assert data["state"] == "running"
    summary = data["summary"]
    assert summary["loss"] == 2.75 and summary["min_loss"] == 2.75  # iter 29's; the eval line is val_loss
    assert 18 < summary["median_steps_s"] < 21 and "median_tok_s" not in summary  # 1000 / 50..52 ms
    assert "steps/s" in summary["throughput"] and "tok/s" not in summary["throughput"]
    text = project.cli("status").stdout
    assert "step=30" in text and "loss=2.75" in text and "steps/s" in text and "tok/s" not in text
    res = project.run("logs", "--metrics", "-n", "1000")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("step=0  loss=4.2  steps_s=20") and "mfu" not in lines[0]
    assert "step=10  loss=3.7" in res.stdout and "mfu=1.5" in res.stdout
    assert lines[-1] == "step=30  val_loss=2.8"
    assert "no metric line" not in res.stderr
    png = project.path / "rate.png"  # a log without a token rate plots its steps/s
    res = project.cli("experiments", "plot", str(exp_id), "--metric", "throughput", "--out", str(png))
    assert res.exit_code == 0, res.output
    assert png.read_bytes().startswith(b"\x89PNG")
    (project.run_dir(exp_id) / "go").touch()
    assert project.cli("stop").exit_code == 0


def test_a_hugging_face_trainer_log_gives_step_of_total_loss_and_a_step_rate(project):
    shutil.copy(LOGS / "hf_trainer_tqdm.log", project.path / "hf.log")
    exp_id, out = deploy(project, "replay.py", REPLAY, "--wait=30", extra=("hf.log",))
    assert "first metrics after" in out and "1/40" in out  # the bar's first update, read from between its \r
    wait_for(lambda: status_json(project)["summary"].get("loss") == 3.895, what="the last logged loss")
    wait_for(lambda: status_json(project)["summary"].get("step") == 40, what="the bar's end")
    summary = status_json(project)["summary"]
    assert summary["total_steps"] == 40  # the evaluation bar's 1/1 did not replace the training bar's total
    assert summary["median_steps_s"] > 0 and "steps/s" in summary["throughput"]
    text = project.cli("status").stdout
    assert "step=40/40" in text and "loss=3.895" in text
    res = project.run("logs", "--metrics", "-n", "1000")
    assert res.returncode == 0, res.stderr
    assert "loss=3.898  grad_norm=0.8794  lr=3.875e-05  epoch=0.625" in res.stdout
    assert "step=20  total_steps=40" in res.stdout and "val_loss=3.896" in res.stdout
    (project.run_dir(exp_id) / "go").touch()
    assert project.cli("stop").exit_code == 0


def test_a_log_with_no_metric_line_says_so_with_the_patterns_hint(project):
    exp_id, _ = deploy(project, "noise.py", NOISE)
    wait_for(lambda: (project.run_dir(exp_id) / "exit.json").exists(), what="the run's end")
    text = project.cli("status").stdout
    assert "! no metric line recognised in 240 lines" in text and "[metrics] patterns" in text
    assert status_json(project)["summary"]["unrecognised_lines"] == 240
    res = project.run("logs", "--metrics")
    assert res.returncode == 0 and res.stdout == ""  # the log was read: nothing on stdout, the notice on stderr
    assert "no metric line recognised in 20 lines" in res.stderr and "hint:" in res.stderr
    assert "[metrics] patterns" in res.stderr


def test_patterns_added_later_re_read_the_earlier_experiments(project):
    ids = []
    for _ in range(2):
        exp_id, _ = deploy(project, "noise.py", NOISE)
        wait_for(lambda: (project.run_dir(exp_id) / "exit.json").exists(), what="the run's end")
        ids.append(exp_id)
    res = project.cli("experiments", "compare", *map(str, ids), "--json")
    assert res.exit_code == 0, res.output
    rows = {r["metric"]: r["values"] for r in json.loads(res.stdout)["metrics"]}
    assert rows["final loss"] == ["-", "-"]  # nothing recognised, and stored as complete
    text = (project.path / "orch.toml").read_text()
    (project.path / "orch.toml").write_text(text + "\n[metrics]\npatterns = { loss = 'L=([0-9.]+)', "
                                                   "steps_s = 'S=([0-9]+)' }\n")
    res = project.cli("experiments", "compare", *map(str, ids), "--json")
    assert res.exit_code == 0, res.output
    result = json.loads(res.stdout)
    rows = {r["metric"]: r["values"] for r in result["metrics"]}
    assert rows["final loss"] == ["0.761", "0.761"] and rows["min loss"] == ["0.761", "0.761"]
    assert rows["loss trend"][0] != "-"
    rates = rows["median throughput"]
    assert rates[0].endswith(" steps/s") and "steps/s, ±0% vs exp" in rates[1] and "tok/s" not in " ".join(rates)
    assert project.cli("experiments", "compare", "--no-refresh", *map(str, ids)).exit_code == 0
    stored = project.registry().metrics(ids[0])
    assert stored["summary"]["loss"] == 0.761  # kept: the next compare reads nothing again
    assert "unrecognised_lines" not in stored["summary"]


def test_metrics_of_a_collected_run_folder_survive_a_pattern_change(project):
    exp_id, _ = deploy(project, "train.py", NANOGPT.replace("while not os.path.exists(go):", "while False:"))
    wait_for(lambda: (project.run_dir(exp_id) / "exit.json").exists(), what="the run's end")
    other, _ = deploy(project, "train.py", NANOGPT.replace("while not os.path.exists(go):", "while False:"))
    wait_for(lambda: (project.run_dir(other) / "exit.json").exists(), what="the second run's end")
    res = project.cli("experiments", "compare", str(exp_id), str(other), "--json")
    assert res.exit_code == 0, res.output
    shutil.rmtree(project.run_dir(exp_id))  # as orch gc does with old run folders
    text = (project.path / "orch.toml").read_text()
    (project.path / "orch.toml").write_text(text + "\n[metrics]\npatterns = { tokens = 'tokens ([0-9]+)' }\n")
    res = project.cli("experiments", "compare", str(exp_id), str(other), "--json")
    assert res.exit_code == 0, res.output
    rows = {r["metric"]: r["values"] for r in json.loads(res.stdout)["metrics"]}
    assert rows["final loss"] == ["2.75", "2.75"]  # the first's log is gone: what was read from it is kept
    assert project.registry().metrics(exp_id)["summary"]["_state"]["no_run_folder"] is True


def test_a_run_that_died_after_one_line_gets_no_patterns_hint(project):
    """A run that never trained (its script raised at once) printed no metric because there was none: status shows
    its last line and exit code, and does not send the user off to write [metrics] patterns."""
    exp_id, _ = deploy(project, "crash.py", "import sys\nsys.exit('cannot open data/train.bin')\n")
    wait_for(lambda: (project.run_dir(exp_id) / "exit.json").exists(), what="the run's end")
    data = wait_for(lambda: (d := status_json(project))["state"] == "crashed" and d, what="the run read as crashed")
    assert "unrecognised_lines" not in data["summary"] and not data["summary"]["notes"]
    text = project.cli("status").stdout
    assert "crashed (exit code 1)" in text and "last log line (" in text and "cannot open data/train.bin" in text
    assert "no metric line" not in text and "[metrics] patterns" not in text
