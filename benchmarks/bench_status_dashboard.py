"""`orch status` with the dashboard open on a live run: how much slower, and whether it ever says the registry is
locked.

One project on the built-in local target, a run deployed there that prints `step=N loss=X` every --every s, and `orch
ui` started with a poller doing what an open experiment page does, every --poll s (the page polls every 5 s; this
is the harder case): the experiment, its status (a real `orch status --json` the server runs), its checkpoints and
the table. --runs times over, an `orch status` with the poller paused (no request of it under way), then one with
it polling: taking turns, so that the other load of a shared machine falls on both alike.
Prints one table (medians, and how many statuses printed a lock message) and the CPU the dashboard took meanwhile (its
server, the commands it ran and their agents: what a user's status shares the machine with); asserts nothing about
time.
Run: python benchmarks/bench_status_dashboard.py [--runs 15] [--poll 1]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

TICKER = ("import sys, time\nevery = float(sys.argv[1])\nfor i in range(1, 10**7):\n"
          "    print(f'step={i} loss={10 / i:.5f}', flush=True)\n    time.sleep(every)\n")
ENV = {**os.environ, "ORCH_WARM": "0"}


def orch(work: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], cwd=work, capture_output=True,
                          text=True, env=ENV, **kw)


def statuses(work: Path, runs: int) -> tuple[list[float], int]:
    """``runs`` back-to-back `orch status`: their wall times, and how many said the registry was locked."""
    times, locked = [], 0
    for _ in range(runs):
        begin = time.perf_counter()
        res = orch(work, "status")
        times.append(time.perf_counter() - begin)
        assert res.returncode == 0, res.stderr
        locked += "locked" in res.stderr
    return times, locked


def tree_cpu(pid: int) -> float:
    """CPU seconds of process ``pid``, of its children it has waited for, and of its descendants still running."""
    tick, procs = os.sysconf("SC_CLK_TCK"), {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            times = list(map(int, fields[11:15]))  # utime, stime, and those of the children waited for
            procs[int(name)] = (int(fields[1]), sum(times) / tick, sum(times[:2]) / tick)
    total, todo = 0.0, [pid]
    while todo:
        at = todo.pop()
        if at in procs:
            total += procs[at][1] if at == pid else procs[at][2]  # (a descendant's waited-for children: in its own)
            todo += [child for child, (parent, _, _) in procs.items() if parent == at]
    return total


def poll(base: str, token: str, exp_id: int, every: float, stop: threading.Event, counts: dict,
         active: threading.Event, busy: threading.Lock) -> None:
    """What an open experiment page asks, every ``every`` s while ``active``, until ``stop``; ``busy`` held while
    a round of requests is under way."""
    paths = [f"/api/experiments/{exp_id}", f"/api/experiments/{exp_id}/status",
             f"/api/experiments/{exp_id}/checkpoints", "/api/experiments?limit=100"]
    while not stop.is_set():
        if not active.wait(0.1):
            continue
        with busy:
            ask(base, token, paths, counts)
        stop.wait(every)


def ask(base: str, token: str, paths: list[str], counts: dict) -> None:
    for path in paths:
        req = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                body = r.read().decode()
            counts["ok"] += 1
            counts["locked"] += "locked" in body
        except OSError as exc:
            counts["failed"] += 1
            said = getattr(exc, "read", lambda: b"")().decode(errors="replace")
            counts["locked"] += "locked" in said
            counts.setdefault("why", f"{path}: {said or exc}"[:300])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--every", type=float, default=0.05, help="seconds between the run's metric lines")
    ap.add_argument("--poll", type=float, default=1.0, help="seconds between the dashboard's rounds of requests")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="orch-bench-status-ui-"))
    root = work / "target"
    (work / "ticker.py").write_text(TICKER)
    (work / "orch.toml").write_text(
        f'[project]\nname = "statusui"\nsources = ["ticker.py"]\ncommand = "python3 ticker.py {a.every}"\n'
        f'[run]\nstop_timeout = 2\n[targets.local]\nkind = "local"\nroot = "{root}"\n'
        f'checkpoints = "{root}/checkpoints"\n')
    server = None
    stop = threading.Event()
    counts = {"ok": 0, "failed": 0, "locked": 0}
    try:
        res = orch(work, "deploy", "-m", "the live one", "--json", check=True)
        live = json.loads(res.stdout)["experiment"]["id"]
        orch(work, "status", check=True)  # the registry made and the first read done: each status reads what is new
        server = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "ui"], cwd=work,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ENV)
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        base, token = url.split("/?token=")[0], url.split("token=")[1]
        active, busy = threading.Event(), threading.Lock()
        poller = threading.Thread(target=poll, args=(base, token, live, a.poll, stop, counts, active, busy),
                                  daemon=True)
        poller.start()
        alone, beside, alone_locked, beside_locked, used, spent = [], [], 0, 0, 0.0, 0.0
        for _ in range(a.runs):
            active.clear()
            with busy:  # (its round under way ends)
                pass
            took, locked = statuses(work, 1)
            alone, alone_locked = alone + took, alone_locked + locked
            cpu0, wall0 = tree_cpu(server.pid), time.monotonic()
            active.set()
            time.sleep(a.poll)  # (its requests under way)
            took, locked = statuses(work, 1)
            beside, beside_locked = beside + took, beside_locked + locked
            used, spent = used + tree_cpu(server.pid) - cpu0, spent + time.monotonic() - wall0
        cores = used / spent
    finally:
        stop.set()
        if server is not None:
            server.terminate()
            server.wait()
        orch(work, "stop")
        subprocess.run(["tmux", "-L", f"orch-{hashlib.sha256(str(root).encode()).hexdigest()[:8]}", "kill-server"],
                       capture_output=True)
    m0, m1 = statistics.median(alone), statistics.median(beside)
    print(f"\n`orch status` of a live run (a line every {a.every:g} s) on the local target, {a.runs} of each in turn; "
          f"the dashboard polling every {a.poll:g} s ({counts['ok']} requests answered, {counts['failed']} failed"
          + (f"; the first: {counts['why']}" if "why" in counts else "") + ")")
    print("| what | median | max | lock messages |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| alone | {m0 * 1000:.0f} ms | {max(alone) * 1000:.0f} ms | {alone_locked} |")
    print(f"| the dashboard open | {m1 * 1000:.0f} ms | {max(beside) * 1000:.0f} ms | {beside_locked} "
          f"(dashboard: {counts['locked']}) |")
    print(f"| ratio | {m1 / m0:.2f}x | | |")
    print(f"\nthe dashboard took {cores:.2f} cores of CPU while it polled (its server, the commands it ran, their "
          "agents)")


if __name__ == "__main__":
    main()
