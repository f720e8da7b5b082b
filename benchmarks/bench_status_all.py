"""`orch status --all` with unreachable targets: all targets are asked at once, so the command costs about the
slowest single target, not the sum of their timeouts.

Stands up, on loopback only, SSH "hosts" that accept TCP and never answer (the shape of a frozen CT or a
dead host behind a NAT: every one costs its whole connect timeout), plus the built-in local target with a
finished run. Measures medians over --runs of:
  - `orch status --target dead1` (one unreachable target: the slowest single target);
  - `orch status` on the local target;
  - `orch status --all` over the local target and --dead unreachable ones; its ratio to the slowest single.
Run: python benchmarks/bench_status_all.py [--runs N] [--dead 3] [--timeout 2]
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def silent_listener() -> tuple[socket.socket, int]:
    """A TCP port on loopback that accepts and then says nothing (no SSH banner ever comes)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(srv.accept()[0])
            except OSError:
                return
    threading.Thread(target=accept, daemon=True).start()
    return srv, srv.getsockname()[1]


def median_s(argv: list[str], cwd: Path, runs: int) -> tuple[float, str]:
    times, out = [], ""
    for _ in range(runs):
        t = time.perf_counter()
        res = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
        times.append(time.perf_counter() - t)
        out = res.stdout + res.stderr
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dead", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=2.0)
    a = ap.parse_args()
    from orchestrator.records.experiments import Registry

    work = Path(tempfile.mkdtemp(prefix="orch-bench-all-"))
    listeners = [silent_listener() for _ in range(a.dead)]
    try:
        shutil.copy(REPO / "examples" / "tinylm" / "train.py", work / "train.py")
        dead = "".join(f'\n[targets.dead{i + 1}]\nkind = "ssh"\nhost = "127.0.0.1"\nport = {port}\nuser = "root"\n'
                       for i, (_, port) in enumerate(listeners))
        (work / "orch.toml").write_text(
            f'default_target = "local"\n[project]\nname = "bench"\nsources = ["train.py"]\ncommand = "python3 -c pass"\n'
            f'[targets.local]\nkind = "local"\nroot = "{work}/target"\ncheckpoints = "{work}/target/ckpt"\n'
            f'[ssh]\nconnect_timeout = {a.timeout}\nconnect_retries = 0\nknown_hosts = ["{work}/known_hosts"]\n'
            + dead)
        (work / "known_hosts").write_text("")
        orch = [sys.executable, "-m", "orchestrator.cli.main"]
        subprocess.run([*orch, "deploy"], cwd=work, capture_output=True, check=True)
        with Registry(work / ".orch" / "experiments.db") as reg:  # what earlier runs on those hosts left
            for i in range(a.dead):
                reg.create(project="bench", target=f"dead{i + 1}", revision="0" * 16, command=["python3"],
                           status="running", started=time.time())
        one_dead, _ = median_s([*orch, "status", "--target", "dead1"], work, a.runs)
        local, _ = median_s([*orch, "status", "--no-metrics"], work, a.runs)
        every, out = median_s([*orch, "status", "--all", "--no-metrics"], work, a.runs)
        assert out.count("unreachable") == a.dead, out
        slowest = max(one_dead, local)
        print(f"\n| case (medians of {a.runs}) | wall | x slowest single |\n|---|---|---|")
        print(f"| status, one unreachable target (connect timeout {a.timeout:g} s) | {one_dead:.2f} s | "
              f"{one_dead / slowest:.2f} |")
        print(f"| status, local target | {local:.2f} s | {local / slowest:.2f} |")
        print(f"| status --all: local + {a.dead} unreachable | {every:.2f} s | {every / slowest:.2f} |")
        print(f"\nsequential would be about {local + a.dead * one_dead:.2f} s")
    finally:
        for srv, _ in listeners:
            srv.close()
        subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "stop"], cwd=work, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
