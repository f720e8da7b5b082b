"""A job over several LXC containers: orch against hand-typed torchrun over ssh, in the same run.

Stands up the test suite's LXC testbed (needs root and LXC; waits for the testbed's session lock), mounts the
torch site folder into the CTs (MULTINODE.md, option B) and runs examples/ddp (gloo, CPU). Medians over --runs:
  1. wall time of `orch deploy` for a 1-node, 2-node and 3-node job (CT 202 is made for it: ~0.3 s), as a ratio
     to the 1-node deploy;
  2. launch -> first training step of the 2-node job: `orch deploy --ct 200 --ct 201` against the hand-typed
     pair of torchrun commands (MULTINODE.md's recipe, started over ssh at once), as a ratio to the pair;
  3. `kill -9` of node 1's training worker -> the last launcher or worker of the job gone on both nodes.
Times of (2) and (3) are read inside the CTs (`date` next to `grep`/`pgrep` loops; the CTs share the host's
clock), so ssh round trips are not counted. Never asserts on wall time.
Run as root: python benchmarks/bench_multinode.py [--runs N]
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
sys.path.insert(0, str(REPO))

EXAMPLE = REPO / "examples" / "ddp"
FILES = ("train.py", "synthetic.py")
WORKLOAD = {"OMP_NUM_THREADS": "1", "DDP_STEPS": "100000", "DDP_SLEEP": "0.2", "DDP_CKPT_EVERY": "100000"}
JOB = "[t]orch.distributed.run|[t]rain.py"  # bracketed: the watching shell's own command line never matches
HAND = "/root/hand"


def median_of(fn, runs: int) -> float:
    return statistics.median(fn(i) for i in range(runs))


class Bench:
    def __init__(self, bed, work: Path) -> None:
        self.bed, self.proj = bed, work / "proj"
        runtime = work / "run"  # a connection keeper of this run's own, in this network namespace
        runtime.mkdir(mode=0o700)
        self.env = dict(os.environ, ORCH_PROXMOX_TOKEN=bed.api.token_secret, XDG_RUNTIME_DIR=str(runtime))
        self.ssh_opts = bed.ssh_options()

    def write_project(self) -> None:
        self.proj.mkdir()
        for name in FILES:
            shutil.copy(EXAMPLE / name, self.proj / name)
        bed = self.bed
        env = ", ".join(f'{k} = "{v}"' for k, v in WORKLOAD.items())
        (self.proj / "orch.toml").write_text(f"""\
[project]
name = "ddpbench"
sources = {list(FILES)!r}
command = "python3 train.py"
env = {{ {env} }}
[paths]
root = "/workspace/orch"
checkpoints = "/workspace/checkpoints"
[batching]
token_budget = 2048
max_seq_len = 128
[run]
stop_timeout = 5
term_timeout = 3
{bed.access_toml(self.proj / "trusted", command_timeout=60)}""".replace("'", '"'))

    def orch(self, *args: str) -> float:
        """Runs the CLI; returns its wall time in seconds."""
        begin = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], cwd=self.proj, env=self.env,
                             capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            raise SystemExit(f"orch {' '.join(args)} failed ({out.returncode}): {out.stderr}")
        return time.perf_counter() - begin

    def ssh(self, vmid: int, script: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(["ssh", *self.ssh_opts, f"root@{self.bed.ct(vmid).address}", script],
                              capture_output=True, text=True, timeout=300, **kw)

    def watch(self, vmid: int, script: str) -> subprocess.Popen:
        """Starts ``script`` in CT ``vmid``; returns once it printed ``ready`` (its timing then starts)."""
        proc = subprocess.Popen(["ssh", *self.ssh_opts, f"root@{self.bed.ct(vmid).address}",
                                 "echo ready; " + script], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        return proc

    @staticmethod
    def stamp(proc: subprocess.Popen, timeout: float = 300) -> float:
        out, _ = proc.communicate(timeout=timeout)
        return float(out.strip().splitlines()[-1])

    # 1. deploy wall time: 1, 2, 3 nodes interleaved round by round (the keeper holds every node's connection)
    def deploy_times(self, cts: list[int], runs: int) -> dict[int, float]:
        sizes = range(1, len(cts) + 1)
        flags = {n: [a for ct in cts[:n] for a in ("--ct", str(ct))] for n in sizes}
        for n in sizes:  # warm: the revision is on every node, every connection held
            self.orch("deploy", *flags[n])
            self.orch("stop")
        took: dict[int, list[float]] = {n: [] for n in sizes}
        for _ in range(runs):
            for n in sizes:
                took[n].append(self.orch("deploy", *flags[n]))
                self.orch("stop")
        return {n: statistics.median(t) for n, t in took.items()}

    # 2. launch -> first step
    def first_step_orch(self, i: int) -> float:
        loop = ("touch /tmp/bench-mark; while :; do for f in /workspace/orch/runs/*/train.log; do "
                "if [ \"$f\" -nt /tmp/bench-mark ] && grep -qs '^step=1 ' \"$f\"; then date +%s.%N; exit 0; fi; "
                "done; sleep 0.02; done")
        watcher = self.watch(200, loop)
        begin = time.time()
        self.orch("deploy", "--ct", "200", "--ct", "201")
        took = self.stamp(watcher) - begin
        self.orch("stop")
        return took

    def hand_start(self, tag: str) -> list[subprocess.Popen]:
        """MULTINODE.md's recipe typed into two ssh sessions at once, node 0 first; returns the ssh processes."""
        env = " ".join(f"{k}={v}" for k, v in WORKLOAD.items())
        procs = []
        for rank, vmid in enumerate((200, 201)):
            addr = self.bed.ct(vmid).address
            cmd = (f"cd {HAND} && rm -f train.log && (GLOO_SOCKET_IFNAME=eth0 {env} "
                   f"ORCH_CHECKPOINT_DIR={HAND}/ck-{tag} setsid nohup python3 -m torch.distributed.run "
                   f"--nnodes=2 --nproc-per-node=1 "
                   f"--rdzv-backend=c10d --rdzv-endpoint={self.bed.ct(200).address}:29400 --rdzv-id=hand-{tag} "
                   f"--rdzv-conf=is_host={1 - min(rank, 1)} --local-addr={addr} train.py "
                   f"> train.log 2>&1 < /dev/null & echo $! > launcher.pid)")
            procs.append(subprocess.Popen(["ssh", *self.ssh_opts, f"root@{addr}", cmd]))
        return procs

    def hand_stop(self) -> None:
        for vmid in (200, 201):  # SIGTERM to both launchers at once (by the pid each shell recorded)
            self.ssh(vmid, f"kill -TERM $(cat {HAND}/launcher.pid) 2>/dev/null; "
                           f"while pgrep -f '{JOB}' >/dev/null; do sleep 0.1; done")

    def first_step_hand(self, i: int) -> float:
        loop = f"rm -f {HAND}/train.log; while ! grep -qs '^step=1 ' {HAND}/train.log; do sleep 0.02; done; date +%s.%N"
        watcher = self.watch(200, loop)
        begin = time.time()
        for p in self.hand_start(f"{i}-{time.time_ns()}"):
            p.wait(timeout=60)
        took = self.stamp(watcher) - begin
        self.hand_stop()
        return took

    # 3. kill -9 of node 1's worker -> the whole job gone
    def until_running(self, logs: dict[int, str]) -> None:
        deadline = time.monotonic() + 180
        for vmid, path in logs.items():
            while "step=2 " not in self.ssh(vmid, f"cat {path} 2>/dev/null").stdout:
                if time.monotonic() > deadline:
                    raise SystemExit(f"CT {vmid}: no step=2 in {path} after 180 s")
                time.sleep(0.5)

    def kill_worker(self) -> list[float]:
        """Kills node 1's worker; returns, per node, the seconds until none of its launchers or workers is left."""
        gone = f"while pgrep -f '{JOB}' >/dev/null; do sleep 0.02; done; date +%s.%N"
        watchers = [self.watch(vmid, gone) for vmid in (200, 201)]
        shot = self.ssh(201, "date +%s.%N; kill -9 $(pgrep -f 'python3 -u train.py')")
        killed = float(shot.stdout.split()[0])
        return [self.stamp(w, 120) - killed for w in watchers]

    def kill_orch(self, i: int) -> list[float]:
        self.orch("deploy", "--ct", "200", "--ct", "201")
        newest = "$(ls -td /workspace/orch/runs/*/ | head -1)train.log"
        self.until_running({200: newest, 201: newest})
        took = self.kill_worker()
        self.orch("status")  # records how the job ended
        return took

    def kill_hand(self, i: int) -> list[float]:
        self.hand_start(f"k{i}-{time.time_ns()}")
        self.until_running({200: f"{HAND}/train.log", 201: f"{HAND}/train.log"})
        return self.kill_worker()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-third", action="store_true", help="skip the 3-node deploy (no CT 202)")
    ap.add_argument("--deploys-only", action="store_true", help="only the deploy wall times (1)")
    a = ap.parse_args()
    from tests.integration.conftest import Testbed
    from tests.testbed import lxc, torchsite

    work = Path(tempfile.mkdtemp(prefix="orch-bench-multinode-"))
    (work / "bed").mkdir()
    with lxc.session_lock():
        bed = Testbed(work / "bed")
        try:
            bed.setup()
            cts = [200, 201] + ([] if a.no_third else [202])
            site = torchsite.ensure_site()
            for vmid in cts:
                bed.reset(vmid)
                torchsite.mount(bed.ct(vmid), site)
            run(Bench(bed, work), cts, a.runs, a.deploys_only)
        finally:
            subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "connections", "close"],
                           env=dict(os.environ, XDG_RUNTIME_DIR=str(work / "run")), capture_output=True)
            for vmid in (200, 201, 202):
                if vmid in bed.cts:
                    torchsite.unmount(bed.ct(vmid))
            bed.teardown()
            shutil.rmtree(work, ignore_errors=True)


def run(b: Bench, cts: list[int], runs: int, deploys_only: bool = False) -> None:
    b.write_project()
    for vmid in (200, 201):
        b.ssh(vmid, f"mkdir -p {HAND}")
        subprocess.run(["scp", "-q", *b.ssh_opts, *(str(EXAMPLE / f) for f in FILES),
                        f"root@{b.bed.ct(vmid).address}:{HAND}/"], check=True)
    deploys = b.deploy_times(cts, runs)
    if deploys_only:
        print(f"{'measure':66} {'s':>7} {'ratio':>7}  baseline   (load average {os.getloadavg()[0]:.1f})")
        for n, took in deploys.items():
            print(f"{f'orch deploy, {n}-node job (CLI wall time)':66} {took:7.2f} {took / deploys[1]:7.2f}  1-node")
        return
    first_orch, first_hand = median_of(b.first_step_orch, runs), median_of(b.first_step_hand, runs)
    kills = {"orch job": [b.kill_orch(i) for i in range(runs)],
             "hand-typed pair": [b.kill_hand(i) for i in range(runs)]}
    gone = {k: [statistics.median(max(r) for r in v)] + [statistics.median(r[n] for r in v) for n in (0, 1)]
            for k, v in kills.items()}

    print(f"examples/ddp (gloo, CPU, torch from a bind-mounted site folder) on testbed CTs {cts}; "
          f"medians of {runs} runs; {os.cpu_count()} cores shared by every CT; load average at the end "
          f"{os.getloadavg()[0]:.1f}")
    print(f"{'measure':66} {'s':>7} {'ratio':>7}  baseline")
    for n, took in deploys.items():
        print(f"{f'orch deploy, {n}-node job (CLI wall time)':66} {took:7.2f} {took / deploys[1]:7.2f}  1-node deploy")
    if len(cts) < 3:
        print(f"{'orch deploy, 3-node job':66} {'-':>7} {'-':>7}  skipped (--no-third)")
    print(f"{'launch -> first step, hand-typed torchrun pair over ssh':66} {first_hand:7.2f} {1.0:7.2f}  hand pair")
    print(f"{'launch -> first step, orch deploy --ct 200 --ct 201':66} {first_orch:7.2f} "
          f"{first_orch / first_hand:7.2f}  hand pair")
    base = gone["hand-typed pair"]
    for who in ("hand-typed pair", "orch job"):
        for col, what in enumerate(("job gone (both nodes)", "node 0 gone", "node 1 gone")):
            took = gone[who][col]
            print(f"{f'kill -9 node 1 worker -> {what}, {who}':66} {took:7.2f} {took / base[col]:7.2f}  hand pair")
    print("deploy = the CLI until 'started' (probe, push of nothing new, record, start node 0 then the others); "
          "first step and job gone are read in the CTs")


if __name__ == "__main__":
    main()
