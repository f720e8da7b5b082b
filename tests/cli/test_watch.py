"""Watching and comparing runs on the local target: following logs, status, compare and plot.

Everything is real: runs in tmux, logs on disk, the registry in SQLite, the CLI in-process and as a
subprocess. The dropped connection is a real local transport whose link fails, not a stand-in.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from orchestrator.config import load_settings
from orchestrator.errors import TransportError
from orchestrator.watch.follow import follow
from orchestrator.reach.targets import resolve_target
from orchestrator.reach.transport.local import LocalTransport
from tests import waits

SPEW = """\
import os, sys, time
out = sys.stdout.buffer
for i in range(int(os.environ.get("SPEW_LINES", "20000"))):
    line = f"step={i} loss={1 + (i % 97) / 100:.4f} tok/s={10000 + i % 500} {'µ' * (i % 7)}{'x' * (i % 50)}\\n"
    data = line.encode()
    if i % 1000 == 0:  # a line written in two pieces: readers must not split or repeat it
        out.write(data[:9]); out.flush(); time.sleep(0.01); out.write(data[9:])
    else:
        out.write(data)
    if i % 200 == 0:
        out.flush(); time.sleep(0.02)
out.flush()
sys.exit(int(os.environ.get("SPEW_EXIT", "0")))
"""

ROTATE = """\
import os, time
run = os.environ["ORCH_RUN_DIR"]
log = os.path.join(run, "train.log")

def wait(name):
    while not os.path.exists(os.path.join(run, name)):
        time.sleep(0.02)

for i in range(50):
    os.write(1, f"first {i}\\n".encode())
os.write(1, b"half a li")
wait("go1")
os.write(1, b"ne, now whole\\n")
wait("go2")
os.ftruncate(1, 0)  # copytruncate-style rotation; then more than before, at once: regrown past the offset
os.write(1, b"".join(f"after truncation {i} {'y' * 40}\\n".encode() for i in range(200)))
wait("go3")
os.rename(log, log + ".1")  # rename-style rotation: a new file under the old name
fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
os.dup2(fd, 1)
os.write(1, b"after rotation\\n")
"""


def deploy_script(project, name: str, source: str, *sets: str) -> int:
    (project.path / name).write_text(source)
    res = project.cli("deploy", "--set", f"project.sources=['{name}']", "--set", f"project.command=python3 {name}",
                      *sets, "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)["experiment"]["id"]


def run_dir(project, exp_id: int) -> Path:
    return project.run_dir(exp_id)


def wait_for(predicate, what: str, timeout: float = 30.0) -> None:
    waits.wait_for(predicate, timeout=timeout, what=what)


def status_json(project) -> dict:
    res = project.cli("status", "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_follow_ends_with_the_run_and_prints_every_byte(project):
    exp_id = deploy_script(project, "spew.py", SPEW, "--set", "project.env.SPEW_EXIT=7")
    assert (run_dir(project, exp_id) / "exit.json").exists() is False  # still writing when we start following
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "logs", "--follow", "-n", "100000000"],
                          cwd=project.path, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    log = (run_dir(project, exp_id) / "train.log").read_bytes()
    assert log.count(b"\n") == 20000
    assert proc.stdout == log
    assert f"experiment {exp_id} crashed (exit code 7)".encode() in proc.stderr
    show = json.loads(project.cli("experiments", "show", str(exp_id), "--json").stdout)
    assert show["status"] == "crashed" and show["exit_code"] == 7  # the follower recorded how it ended


class DroppingLink(LocalTransport):
    """A local connection that drops on its ``drop_at``-th command: before the command reaches the
    target, or (every other connection) after it ran, losing an answer that carried log bytes."""

    made = 0

    def __init__(self, drop_at: int) -> None:
        super().__init__()
        DroppingLink.made += 1
        self.answer_lost = DroppingLink.made % 2 == 0
        self.drop_at, self.calls = drop_at, 0

    def run(self, argv, *, input=None, timeout=None):
        self.calls += 1
        if self.calls == self.drop_at and not self.answer_lost:
            raise TransportError("connection reset by peer")
        result = super().run(argv, input=input, timeout=timeout)
        if self.calls == self.drop_at:
            raise TransportError("connection closed before the answer arrived")
        return result


def test_follow_across_dropped_connections_loses_and_repeats_nothing(project):
    exp_id = deploy_script(project, "spew.py", SPEW)
    settings = load_settings(project.path / "orch.toml")
    target = dataclasses.replace(resolve_target(settings), connect=lambda: DroppingLink(drop_at=4))
    out, notices = bytearray(), []
    result = follow(settings, target, exp_id, write=out.extend, notice=notices.append, follow=True,
                    tail_lines=10**9, poll=0.05, first_backoff=0.05, max_bytes=64 << 10,
                    registry=project.registry().registry_id)
    log = (run_dir(project, exp_id) / "train.log").read_bytes()
    assert bytes(out) == log and result.bytes == len(log)
    assert result.state["state"] == "finished" and result.state["exit_code"] == 0
    assert result.reconnects >= 3
    lost = [n for n in notices if n.startswith("connection lost")]
    assert len(lost) == result.reconnects and "resuming at byte" in lost[0]
    assert any("reset by peer" in n for n in lost) and any("before the answer arrived" in n for n in lost)
    assert sum(n.startswith("reconnected; resuming at byte") for n in notices) == result.reconnects


def test_follow_survives_truncation_and_rotation_and_holds_back_partial_lines(project):
    exp_id = deploy_script(project, "rotate.py", ROTATE)
    folder = run_dir(project, exp_id)
    registry_id = project.registry().registry_id
    settings = load_settings(project.path / "orch.toml")
    target = resolve_target(settings)
    chunks: list[bytes] = []
    notices: list[str] = []
    done: dict = {}

    def run() -> None:
        done["result"] = follow(settings, target, exp_id, write=chunks.append, notice=notices.append,
                                follow=True, tail_lines=10**9, poll=0.05, registry=registry_id)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def seen() -> bytes:
        return b"".join(chunks)

    wait_for(lambda: b"first 49\n" in seen(), "the first lines")
    time.sleep(0.5)  # many polls while the last line is half written
    assert b"half a li" not in seen()
    (folder / "go1").touch()
    wait_for(lambda: b"now whole\n" in seen(), "the completed line")
    assert sum(c.count(b"half a line, now whole\n") for c in chunks) == 1
    first_part = (b"".join(f"first {i}\n".encode() for i in range(50)) + b"half a line, now whole\n")
    (folder / "go2").touch()
    wait_for(lambda: b"after truncation 199 " in seen(), "the lines after truncation")
    (folder / "go3").touch()
    thread.join(30)
    assert not thread.is_alive() and done["result"].state["state"] == "finished"
    truncated = (folder / "train.log.1").read_bytes()
    assert truncated.startswith(b"after truncation 0 ")
    assert seen() == first_part + truncated + (folder / "train.log").read_bytes()
    assert sum("rotated or truncated" in n for n in notices) == 2 and done["result"].resets == 2


def test_status_of_a_running_tinylm_shows_progress(project):
    project.configure(steps=100000, sleep=0.005)
    assert project.cli("deploy").exit_code == 0
    wait_for(lambda: (status_json(project)["summary"].get("step") or 0) >= 20, "two logged steps")
    data = status_json(project)
    assert data["state"] == "running"
    summary = data["summary"]
    assert summary["total_steps"] == 100000 and isinstance(summary["step"], int)
    assert summary["loss"] > 0 and summary["median_tok_s"] > 0 and summary["eta_s"] > 0
    assert not summary["notes"]
    text = project.cli("status").stdout
    assert "running" in text and "step=" in text and "/100000" in text
    for field in ("loss=", "throughput=", "tok/s", "eta="):
        assert field in text
    assert project.cli("stop").exit_code == 0


QUIET = """\
import os, time
go = os.path.join(os.environ["ORCH_RUN_DIR"], "go")
while not os.path.exists(go):  # alive and printing, but no metric yet
    print("loading data", flush=True)
    time.sleep(0.05)
print("step=1 loss=2.5", flush=True)
while True:  # alive and printing, but the step never moves
    print("waiting for a lock", flush=True)
    time.sleep(0.05)
"""


def test_stalls_are_reported_and_ctrl_c_stops_following_not_the_run(project):
    project.configure()
    toml = project.path / "orch.toml"
    toml.write_text(toml.read_text().replace("[run]\n", "[run]\nstall_after = 1.5\n", 1))
    exp_id = deploy_script(project, "quiet.py", QUIET)
    res = project.cli("experiments", "plot", str(exp_id), "--out", str(project.path / "quiet.png"))
    assert res.exit_code == 2 and "has no loss series" in res.output
    assert not (project.path / "quiet.png").exists()
    (run_dir(project, exp_id) / "go").touch()  # the first step, then no more: the log grows, the step does not
    # Ctrl-C stops following, never the run
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "logs", "--follow"], cwd=project.path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline().strip()
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0 and b"stopped following (the run goes on)" in err
    wait_for(lambda: status_json(project)["summary"].get("step") == 1, "the first step")
    time.sleep(2.0)
    data = status_json(project)
    assert data["state"] == "running"  # its supervisor stops a run whose log stops, not one that still prints
    assert any(n.startswith("stalled: no step progress") for n in data["summary"]["notes"])
    assert "stalled: no step progress" in project.cli("status").stdout
    assert project.cli("stop").exit_code == 0


def _wait_ended(project, exp_id: int) -> None:
    wait_for(lambda: (run_dir(project, exp_id) / "exit.json").exists(), f"experiment {exp_id} to end", 60)


def test_compare_lists_a_sources_change_and_show_says_an_exit_code_once(project):
    project.configure(steps=5)
    (project.path / "notes.txt").write_text("sent with the second\n")
    for n, sources in enumerate(('["train.py"]', '["train.py", "notes.txt"]'), 1):
        res = project.cli("deploy", "-m", sources, "--set", f"project.sources={sources}")
        assert res.exit_code == 0, res.output
        _wait_ended(project, n)
    result = json.loads(project.cli("experiments", "compare", "1", "2", "--json").stdout)
    assert {"key": "project.sources", "values": ["train.py", "train.py, notes.txt"]} in result["diff"]
    shown = project.cli("experiments", "show", "2").stdout
    assert "exit code 0" in shown and "exit code 0, exit code 0" not in shown and " how " not in shown


def test_compare_two_batching_strategies_then_plot_them(project, tmp_path):
    project.configure(steps=30)
    for strategy in ("sorted", "shuffle"):
        res = project.cli("deploy", "-m", strategy, "--set", f"batching.strategy={strategy}",
                          "--clean-checkpoints", "--yes")  # train from scratch, not from the last run's end
        assert res.exit_code == 0, res.output
        _wait_ended(project, 1 if strategy == "sorted" else 2)
    # nobody asked for status meanwhile: compare reads the two logs itself
    res = project.cli("experiments", "compare", "1", "2", "--json")
    assert res.exit_code == 0, res.output
    result = json.loads(res.stdout)
    assert result["diff"][0] == {"key": "batching.strategy", "values": ["sorted", "shuffle"]}
    assert [e["status"] for e in result["experiments"]] == ["finished", "finished"]
    rates = [e["median_tok_s"] for e in result["experiments"]]
    assert all(r > 0 for r in rates)
    rows = {r["metric"]: r["values"] for r in result["metrics"]}
    assert "vs exp 1" in rows["median throughput"][1] and rows["final loss"][0] != "-"
    text = project.cli("experiments", "compare", "1", "2").stdout
    assert text.index("batching.strategy") < text.index("metrics") and text.count("tok/s") >= 2
    # status of the newest run shows its throughput against the run before it on the target
    status = project.cli("status").stdout
    assert "finished (exit code 0)" in status and "vs exp 1" in status
    for metric in ("loss", "throughput"):
        png = tmp_path / f"{metric}.png"
        res = project.cli("experiments", "plot", "1", "2", "--metric", metric, "--out", str(png))
        assert res.exit_code == 0, res.output
        data = png.read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000
    # without matplotlib: a clear error, not a traceback
    fake = tmp_path / "no-matplotlib" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")
    res = project.run("experiments", "plot", "1", "--out", str(tmp_path / "x.png"),
                      env={"PYTHONPATH": str(fake.parent)})
    assert res.returncode == 2 and "needs matplotlib" in res.stderr and "pip install '<orch checkout>[plot]'" in res.stderr


def test_plot_refuses_an_unknown_metric(project):
    # any name a log gave is a metric to plot (val_loss, lr: test_public_logs.py); this is no name
    res = project.cli("experiments", "plot", "1", "--metric", "acc; rm", "--out", "x.png")
    assert res.exit_code == 2 and "unknown metric" in res.output
