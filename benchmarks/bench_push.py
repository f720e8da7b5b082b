"""First deploy of a big tree to a real LXC container: orch's streamed push against `tar c | ssh ct tar x`.

Stands up the test suite's LXC testbed (needs root and LXC), builds trees of random data (64 MiB shards
plus 200 small files), and for each size measures in the same run:
  - the baseline: `tar c tree | ssh root@ct tar x -C dir` (OpenSSH, no hashing, no durability sync),
    and the same followed by `sync` on the CT (what orch guarantees: the files are on disk when it returns);
  - `orch deploy --target ssh200` of the same tree to an empty root (hashing, streaming, verifying,
    syncing the blobs, assembling the revision, starting the run);
  - the same deploy with no ``ssh`` on orch's PATH, so that its bytes go over paramiko (the way they went before
    the OpenSSH client carried big pushes; ``--ways openssh`` leaves it out);
  - the peak resident memory (VmHWM) of the orch process and of the agent on the CT during the deploys.
Each run measures the three one after another (pair by pair); the table shows medians and the load average.
Run as root: python benchmarks/bench_push.py [--sizes 0.5,2] [--runs 1] [--ways openssh,paramiko]
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

TRAIN = "import time\nwhile True:\n    time.sleep(1)\n"
ROOT = "/workspace/orch-bench"
TREES: dict[Path, int] = {}


def make_tree(folder: Path, gib: float) -> int:
    import numpy as np

    rng = np.random.default_rng(0)
    data = folder / "data"
    data.mkdir(parents=True)
    total = 0
    for i in range(200):
        blob = rng.bytes(int(rng.integers(100, 20000)))
        (data / f"small{i:03d}.txt").write_bytes(blob)
        total += len(blob)
    shard = 64 << 20
    for i in range(max(1, int(gib * (1 << 30)) // shard)):
        (data / f"shard{i:03d}.bin").write_bytes(rng.bytes(shard))
        total += shard
    (folder / "train.py").write_text(TRAIN)
    return total


def watched(argv: list[str], cwd: Path, env: dict, agent_name: str) -> tuple[float, int, int]:
    """Run ``argv``; its wall time and the peak RSS (KiB) of it and of any agent process."""
    begin = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    from tests.testbed.procs import peak_kb, pids_running

    mine = agent = 0
    while proc.poll() is None:
        mine = max(mine, peak_kb(proc.pid))
        for pid in pids_running(agent_name):
            agent = max(agent, peak_kb(pid))
        time.sleep(0.02)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {err.decode()}")
    return time.perf_counter() - begin, mine, agent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="0.5,2", help="tree sizes in GiB, comma-separated")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--ways", default="openssh,paramiko", help="openssh (ssh on PATH), paramiko (no ssh on PATH)")
    a = ap.parse_args()
    ways = [w for w in a.ways.split(",") if w]
    from orchestrator.reach.agent_client import agent_zip
    from tests.integration.conftest import Testbed
    from tests.testbed import lxc

    work = Path(tempfile.mkdtemp(prefix="orch-bench-push-"))
    (work / "bed").mkdir()
    with lxc.session_lock():
        bed = Testbed(work / "bed")
        try:
            bed.setup()
            bed.reset(200)
            rows = [measure(bed, work, float(size), a.runs, f"agent-{agent_zip()[0]}.pyz", way)
                    for size in a.sizes.split(",") for way in ways]
        finally:
            bed.teardown()
            shutil.rmtree(work, ignore_errors=True)  # the trees: GiBs
    print(f"\nfirst deploy to CT 200 over the testbed bridge; medians of {a.runs} run(s); "
          f"load average {open('/proc/loadavg').read().split()[0]}")
    print(f"{'tree':>8} {'way':>9} {'tar|ssh s':>10} {'+sync s':>8} {'orch s':>8} {'x tar':>6} {'x tar+sync':>10} "
          f"{'orch MB/s':>10} {'peak RSS orch MiB':>18} {'peak RSS agent MiB':>19}")
    for size, way, base, durable, mine, ratio, rss, agent in rows:
        print(f"{size:>7.2f}G {way:>9} {base:10.2f} {durable:8.2f} {mine:8.2f} {ratio:6.2f} {mine / durable:10.2f} "
              f"{size * 1024 / mine:10.0f} {rss >> 10:18d} {agent >> 10:19d}")


def measure(bed, work: Path, gib: float, runs: int, agent_name: str, way: str) -> tuple:
    ct = bed.ct(200)
    proj = work / f"proj-{gib}"
    if proj not in TREES:  # one tree per size, whichever ways measure it
        TREES[proj] = make_tree(proj, gib)
    total = TREES[proj]
    (proj / "orch.toml").write_text(f"""\
default_target = "ssh200"
[project]
name = "bench"
sources = ["train.py", "data"]
command = "python3 train.py"
[paths]
root = "{ROOT}"
checkpoints = "/workspace/bench-checkpoints"
{bed.access_toml(work / "trusted", proxmox=False)}[targets.ssh200]
kind = "ssh"
host = "{ct.address}"
user = "root"
""")
    dest = f"root@{ct.address}"
    ssh = ["ssh", *bed.ssh_options(), dest]
    env = dict(os.environ, XDG_RUNTIME_DIR=tempfile.mkdtemp(dir=work))  # keepers of its own
    if way == "paramiko":  # orch finds no ssh binary: its pushes go over its own paramiko connection
        bare = work / "no-ssh"
        bare.mkdir(exist_ok=True)
        env["PATH"] = str(bare)
    base_times, durable_times, orch_times, ratios, rss, agent = [], [], [], [], 0, 0
    for _ in range(runs):
        subprocess.run([*ssh, f"rm -rf {ROOT} /root/tarcopy; sync"], check=True)
        begin = time.perf_counter()
        tar = subprocess.Popen(["tar", "c", "-C", str(proj), "train.py", "data"], stdout=subprocess.PIPE)
        subprocess.run([*ssh, "mkdir -p /root/tarcopy && tar x -C /root/tarcopy"], stdin=tar.stdout, check=True)
        tar.wait()
        base_times.append(time.perf_counter() - begin)
        subprocess.run([*ssh, "sync"], check=True)
        durable_times.append(time.perf_counter() - begin)
        subprocess.run([*ssh, "rm -rf /root/tarcopy; sync"], check=True)
        (proj / ".orch").exists() and subprocess.run(["rm", "-rf", str(proj / ".orch")], check=True)
        seconds, mine, theirs = watched([sys.executable, "-m", "orchestrator.cli.main", "deploy", "--json"],
                                        proj, env, agent_name)
        orch_times.append(seconds)
        ratios.append(seconds / base_times[-1])
        rss, agent = max(rss, mine), max(agent, theirs)
        subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "stop"], cwd=proj, env=env,
                       capture_output=True)
    subprocess.run([*ssh, f"rm -rf {ROOT}"], check=True)
    subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "connections", "close"], cwd=proj, env=env,
                   capture_output=True)  # the keepers exit with the bench, not 10 minutes later
    return (total / (1 << 30), way, statistics.median(base_times), statistics.median(durable_times),
            statistics.median(orch_times), statistics.median(ratios), rss, agent)


if __name__ == "__main__":
    main()
