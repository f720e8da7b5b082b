"""Deploy to a real Slurm cluster (two LXC containers, ``tests/testbed/slurm.py``): orch against the hand-typed pair.

Measures, medians over --runs:
  - the hand-typed baseline: copy the script to the shared folder through the login node (``scp``; ``rsync`` where
    this machine has it), then ``ssh login scancel --name=hand; sbatch --parsable --wrap "python3 train.py"``;
  - ``orch deploy`` of an unchanged revision and of a one-line change (each replaces the job before it: SIGINT to
    its steps, waiting for the run's exit, which the workload gives at once);
  - the delay from a job's start (its supervisor's start, on the compute node) to the first ``orch status`` that
    says ``running``, polling status back to back, for a job that was pending behind a full cluster.
Run as root: python benchmarks/bench_slurm.py [--runs N]
"""

from __future__ import annotations

import argparse
import json
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

TRAIN = ("import signal, sys, time\n# revision {n}\nsignal.signal(signal.SIGINT, lambda *_: sys.exit(0))\n"
         "while True:\n    print('step=1 loss=1.0', flush=True)\n    time.sleep(0.5)\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    from tests.testbed import lxc
    from tests.testbed.slurm import Cluster

    work = Path(tempfile.mkdtemp(prefix="orch-bench-slurm-"))
    key = work / "id_ed25519"
    lxc.sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key))
    cluster = Cluster(Path(f"{key}.pub").read_text(), lxc.LXC_PATH / "slurm-shared")
    try:
        took = cluster.setup()
        print(f"cluster up in {took:.1f} s")
        known = work / "known_hosts"
        known.write_text("".join(ct.host_key_line + "\n" for ct in cluster.nodes))
        run(cluster, work, key, known, a.runs)
    finally:
        cluster.teardown()
        lxc.remove_bridge()
        shutil.rmtree(work, ignore_errors=True)


def run(cluster, work: Path, key: Path, known: Path, runs: int) -> None:
    login = cluster.login.address
    ssh = ["-i", str(key), "-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes",
           "-o", "BatchMode=yes"]
    proj = work / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(TRAIN.format(n=0))
    (proj / "orch.toml").write_text(f"""\
default_target = "lab"
[project]
name = "bench"
sources = ["train.py"]
command = "python3 train.py"
[run]
stop_timeout = 10
[ssh]
known_hosts = ["{known}"]
identity_file = "{key}"
trust_file = "{work / 'trusted'}"
[targets.lab]
kind = "slurm"
host = "{login}"
user = "root"
root = "/shared/orch"
""")
    env = dict(os.environ, XDG_RUNTIME_DIR=str(work / "xdg"))
    (work / "xdg").mkdir(mode=0o700)

    def orch(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], cwd=proj, env=env,
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise SystemExit(f"orch {' '.join(args)} failed: {done.stdout}{done.stderr}")
        return done

    def hand(i: int) -> None:
        (proj / "train.py").write_text(TRAIN.format(n=i))
        copy = (["rsync", "-e", "ssh " + " ".join(ssh)] if shutil.which("rsync") else ["scp", "-q", *ssh])
        subprocess.run([*copy, str(proj / "train.py"), f"root@{login}:/shared/hand/"], check=True)
        subprocess.run(["ssh", *ssh, f"root@{login}", "scancel --name=hand; sbatch --parsable --job-name=hand "
                        "--output=/shared/hand/out.log --wrap 'python3 /shared/hand/train.py'"],
                       check=True, capture_output=True)

    cluster.run("mkdir", "-p", "/shared/hand")
    hand(0)
    orch("deploy")  # the first: the agent and the revision go over once
    rows = []
    base = timed(hand, runs)
    rows.append(("hand-typed copy + sbatch", base))
    same = timed(lambda i: orch("deploy"), runs)
    rows.append(("orch deploy, unchanged revision", same))

    def changed(i: int) -> None:
        (proj / "train.py").write_text(TRAIN.format(n=100 + i))
        orch("deploy")

    rows.append(("orch deploy, a one-line change", timed(changed, runs)))
    cluster.run("scancel", "--name=hand", check=False)
    orch("stop")
    print(f"\n| deploy to the Slurm cluster (median of {runs}) | ms | x baseline |\n| --- | ---: | ---: |")
    for name, ms in rows:
        print(f"| {name} | {ms:.0f} | {ms / base:.2f} |")
    delays = [start_delay(cluster, orch) for _ in range(runs)]
    print(f"\n| from a job's start to orch status saying running (median of {runs}) | s |\n| --- | ---: |")
    print(f"| pending behind a full cluster, then started | {statistics.median(delays):.2f} |")


def start_delay(cluster, orch) -> float:
    """Seconds from the supervisor's start on a compute node to the first status that says ``running``."""
    blocker = cluster.run("sbatch", "--parsable", "-N2", "--exclusive", "--wrap", "sleep 300").stdout.decode().strip()
    orch("deploy")
    cluster.run("scancel", blocker)
    seen = None
    while seen is None:
        st = json.loads(orch("status", "--json", "--no-metrics").stdout)
        if st["state"] == "running":
            seen = time.time()
    started = st["started"]  # the supervisor's pid file: the moment its command was spawned
    orch("stop")
    return seen - started


def timed(fn, runs: int) -> float:
    times = []
    for i in range(runs):
        t = time.perf_counter()
        fn(i + 1)
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


if __name__ == "__main__":
    main()
