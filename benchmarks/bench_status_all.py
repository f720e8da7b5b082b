"""`orch status --all` over many targets: all are asked at once, so the command costs about the slowest single
target, not the sum of them.

Two fleets on loopback only, each against its slowest single target, in the same run:
  - live: --live real OpenSSH servers (``tests/loopback_sshd.py``, one sshd per "host", each its own host key and
    orch root), each with a run orch deployed there; `orch status --target hN` for --singles of them, spread over
    the fleet (the slowest of their medians is the bar's "slowest single") against `orch status --all`, warm (the connection keeper holds
    every connection) and cold (``[ssh] persist = 0``: every command connects and asks on its own);
  - dead: --dead SSH "hosts" that accept TCP and never answer (a frozen CT, a dead host behind a NAT: each costs
    its whole connect timeout), beside the built-in local target with a finished run.
Rounds are interleaved (every single, then --all, per round); medians over --runs rounds. Here the hosts share
this machine's cores: cold, each pays an SSH handshake and a one-shot agent start on them (about 0.35 s of CPU
a host, read from the sshd processes' reaped children), so the cold --all row measures their sum where a real
fleet's hosts each pay their own.
Run: python benchmarks/bench_status_all.py [--runs N] [--live 20] [--dead 3] [--timeout 2]
"""

from __future__ import annotations

import argparse
import os
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
ORCH = [sys.executable, "-m", "orchestrator.cli.main"]


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


def timed(argv: list[str], cwd: Path, env: dict | None = None) -> tuple[float, str, int]:
    t = time.perf_counter()
    res = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False, env=env)
    return time.perf_counter() - t, res.stdout + res.stderr, res.returncode


def median_s(argv: list[str], cwd: Path, runs: int) -> tuple[float, str]:
    times, out = [], ""
    for _ in range(runs):
        took, out, _ = timed(argv, cwd)
        times.append(took)
    return statistics.median(times), out


def live_fleet(work: Path, count: int, runs: int, singles: int) -> list[tuple[str, float, float]]:
    """(mode, slowest single median, --all median) for ``count`` live SSH hosts, warm then cold."""
    from tests.loopback_sshd import LoopbackSshd

    hosts: list[LoopbackSshd] = []
    try:
        for i in range(count):
            hosts.append(LoopbackSshd(work / f"sshd{i}").__enter__())
        key = hosts[0].key  # one key every host accepts
        for h in hosts[1:]:
            (h.state / "authorized_keys").write_text((hosts[0].state / "known.pub").read_text())
        (work / "known_hosts").write_text("".join(h.host_key_line() for h in hosts))
        targets = "".join(f'\n[targets.h{i}]\nkind = "ssh"\nhost = "127.0.0.1"\nport = {h.port}\nuser = "root"\n'
                          f'root = "{work}/h{i}/orch"\ncheckpoints = "{work}/h{i}/ckpt"\n'
                          for i, h in enumerate(hosts))
        proj = work / "live"
        proj.mkdir()
        (proj / "orch.toml").write_text(
            f'default_target = "h0"\n[project]\nname = "fleet"\nsources = ["train.py"]\n'
            f'command = "python3 train.py"\n'
            f'[ssh]\nknown_hosts = ["{work}/known_hosts"]\nidentity_file = "{key}"\n' + targets)
        (proj / "train.py").write_text("print('step=1 loss=1.0', flush=True)\n")
        env = dict(os.environ)
        for i in range(count):  # a finished run on every host (its records and its run folder there)
            took, out, rc = timed([*ORCH, "deploy", "--target", f"h{i}", "--wait"], proj, env)
            if rc != 0:
                raise SystemExit(f"deploy to h{i} failed: {out}")
        results = []
        for mode, extra in (("warm", {}), ("cold", {"ORCH_SSH__PERSIST": "0"})):
            menv = dict(env, **extra)
            timed_alone = sorted({i * count // singles for i in range(singles)})  # spread over the fleet
            single: dict[int, list[float]] = {i: [] for i in timed_alone}
            every: list[float] = []
            timed([*ORCH, "status", "--all", "--no-metrics"], proj, menv)  # warm: every connection held
            for _ in range(runs):
                for i in timed_alone:
                    took, out, rc = timed([*ORCH, "status", "--target", f"h{i}", "--no-metrics"], proj, menv)
                    assert rc == 0 and "finished" in out, out
                    single[i].append(took)
                took, out, rc = timed([*ORCH, "status", "--all", "--no-metrics"], proj, menv)
                assert rc == 0 and out.count("finished") >= count, out
                every.append(took)
            slowest = max(statistics.median(t) for t in single.values())
            results.append((mode, slowest, statistics.median(every)))
        return results
    finally:
        for h in hosts:
            h.__exit__(None, None, None)


def dead_fleet(work: Path, dead: int, timeout: float, runs: int) -> tuple[float, float, float]:
    from orchestrator.records.experiments import Registry

    listeners = [silent_listener() for _ in range(dead)]
    proj = work / "dead"
    proj.mkdir()
    try:
        shutil.copy(REPO / "examples" / "tinylm" / "train.py", proj / "train.py")
        targets = "".join(f'\n[targets.dead{i + 1}]\nkind = "ssh"\nhost = "127.0.0.1"\nport = {port}\nuser = "root"\n'
                          for i, (_, port) in enumerate(listeners))
        (proj / "orch.toml").write_text(
            f'default_target = "local"\n[project]\nname = "bench"\nsources = ["train.py"]\ncommand = "python3 -c pass"\n'
            f'[targets.local]\nkind = "local"\nroot = "{proj}/target"\ncheckpoints = "{proj}/target/ckpt"\n'
            f'[ssh]\nconnect_timeout = {timeout}\nconnect_retries = 0\nknown_hosts = ["{proj}/known_hosts"]\n'
            + targets)
        (proj / "known_hosts").write_text("")
        subprocess.run([*ORCH, "deploy"], cwd=proj, capture_output=True, check=True)
        with Registry(proj / ".orch" / "experiments.db") as reg:  # what earlier runs on those hosts left
            for i in range(dead):
                reg.create(project="bench", target=f"dead{i + 1}", revision="0" * 16, command=["python3"],
                           status="running", started=time.time())
        one_dead, _ = median_s([*ORCH, "status", "--target", "dead1"], proj, runs)
        local, _ = median_s([*ORCH, "status", "--no-metrics"], proj, runs)
        every, out = median_s([*ORCH, "status", "--all", "--no-metrics"], proj, runs)
        assert out.count("unreachable") == dead, out
        return one_dead, local, every
    finally:
        for srv, _ in listeners:
            srv.close()
        subprocess.run([*ORCH, "stop"], cwd=proj, capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--live", type=int, default=20, help="live SSH hosts (0: none)")
    ap.add_argument("--singles", type=int, default=5, help="hosts timed alone, spread over the fleet")
    ap.add_argument("--dead", type=int, default=3, help="silent SSH hosts (0: none)")
    ap.add_argument("--timeout", type=float, default=2.0)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="orch-bench-all-"))
    runtime = work / "run"  # this benchmark's own connection keeper and warm process, closed at the end
    runtime.mkdir(mode=0o700)
    os.environ["XDG_RUNTIME_DIR"] = str(runtime)
    try:
        print(f"\n| case (medians of {a.runs}) | wall | x slowest single |\n|---|---|---|")
        if a.live:
            for mode, slowest, every in live_fleet(work, a.live, a.runs, min(a.singles, a.live)):
                print(f"| {mode}: slowest single ({min(a.singles, a.live)} of the {a.live} live SSH hosts timed "
                      f"alone) | {slowest:.2f} s | 1.00 |")
                print(f"| {mode}: status --all over the {a.live} hosts | {every:.2f} s | {every / slowest:.2f} |")
        if a.dead:
            one_dead, local, every = dead_fleet(work, a.dead, a.timeout, a.runs)
            slowest = max(one_dead, local)
            print(f"| status, one unreachable target (connect timeout {a.timeout:g} s) | {one_dead:.2f} s | "
                  f"{one_dead / slowest:.2f} |")
            print(f"| status, local target | {local:.2f} s | {local / slowest:.2f} |")
            print(f"| status --all: local + {a.dead} unreachable | {every:.2f} s | {every / slowest:.2f} |")
        print(f"\n{os.cpu_count()} cores; load average at the end {os.getloadavg()[0]:.1f}")
    finally:
        subprocess.run([*ORCH, "connections", "close"], cwd=work, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
