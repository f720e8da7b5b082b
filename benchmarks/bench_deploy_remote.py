"""Deploy to a real LXC container: orch against the hand-typed scp + ssh + tmux baseline, in the same run.

Stands up the test suite's LXC testbed (needs root and LXC; the base image is cached), then measures
on CT 200, medians over --runs:
  - the hand-typed baseline: `scp train.py ct: && ssh ct "tmux kill-session -t train; tmux new -d ..."`
  - `orch deploy --target ssh200` (straight SSH) and `orch deploy --ct 200` (Proxmox API + SSH), each for an
    unchanged revision and a one-line change, as a ratio to the baseline; the --ct case again with every lookup
    through the API (`[proxmox] cache_ttl = 0`);
  - bytes sent for a one-line change in a 50 MB source tree;
  - SSH connections and round trips (agent calls / remote commands) per deploy.
The workload exits on SIGINT at once, like the baseline's kill, so stop costs are comparable.
Run as root: python benchmarks/bench_deploy_remote.py [--runs N] [--mb 50]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TRAIN = "import time\n# revision {n}\nwhile True:\n    time.sleep(1)\n"


def timed(fn, runs: int) -> tuple[float, list]:
    times, outs = [], []
    for i in range(runs):
        t = time.perf_counter()
        outs.append(fn(i))
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times), outs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--mb", type=float, default=50.0)
    a = ap.parse_args()
    from tests.integration.conftest import Testbed

    work = Path(tempfile.mkdtemp(prefix="orch-bench-remote-"))
    (work / "bed").mkdir()
    bed = Testbed(work / "bed")
    try:
        bed.setup()
        bed.reset(200)
        run(bed, work, a)
    finally:
        bed.teardown()


def run(bed, work: Path, a) -> None:
    ct = bed.ct(200)
    proj = work / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(TRAIN.format(n=0))
    ssh_opts = bed.ssh_options()
    api = bed.api
    (proj / "orch.toml").write_text(f"""\
default_target = "ssh200"
[project]
name = "bench"
sources = ["train.py", "data"]
command = "python3 train.py"
[paths]
root = "/workspace/orch"
checkpoints = "/workspace/checkpoints"
{bed.access_toml(work / "trusted")}[targets.ssh200]
kind = "ssh"
host = "{ct.address}"
user = "root"
[targets.ct200]
kind = "proxmox"
ct = 200
""")
    data = proj / "data"
    data.mkdir()
    per = 1 << 20
    for i in range(int(a.mb)):
        (data / f"shard{i:03d}.bin").write_bytes(os.urandom(per))
    env = dict(os.environ, ORCH_PROXMOX_TOKEN=api.token_secret)

    def orch(*args: str) -> dict:
        out = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args, "--json"], cwd=proj, env=env,
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"orch {' '.join(args)} failed: {out.stderr}")
        return json.loads(out.stdout)

    first = orch("deploy")
    dest = f"root@{ct.address}"

    def by_hand(i: int) -> None:
        (proj / "train.py").write_text(TRAIN.format(n=1000 + i))
        subprocess.run(["scp", "-q", *ssh_opts, str(proj / "train.py"), f"{dest}:train.py"], check=True)
        subprocess.run(["ssh", *ssh_opts, dest, "tmux kill-session -t train; tmux new -d -s train python3 train.py"],
                       check=True, capture_output=True)

    base, _ = timed(by_hand, a.runs)
    subprocess.run(["ssh", *ssh_opts, dest, "tmux kill-server"], capture_output=True)
    rows = []
    for target in ("ssh200", "ct200"):
        ms, outs = timed(lambda i: orch("deploy", "--target", target), a.runs)
        rows.append((f"orch deploy --target {target}, unchanged", ms, outs[-1]))

        def changed(i: int, target=target) -> dict:
            (proj / "train.py").write_text(TRAIN.format(n=time.time_ns()))
            return orch("deploy", "--target", target)

        ms, outs = timed(changed, a.runs)
        rows.append((f"orch deploy --target {target}, 1 line changed", ms, outs[-1]))

    def uncached(i: int) -> dict:  # every lookup through the API, as before [proxmox] cache_ttl
        (proj / "train.py").write_text(TRAIN.format(n=time.time_ns()))
        return orch("deploy", "--target", "ct200", "--set", "proxmox.cache_ttl=0")

    ms, outs = timed(uncached, a.runs)
    rows.append(("orch deploy --target ct200, cache_ttl=0, 1 line", ms, outs[-1]))
    orch("stop")
    print(f"CT 200 over the testbed bridge; source tree {a.mb:.0f} MB + train.py; medians of {a.runs} runs")
    print(f"{'deploy':44} {'ms':>7} {'x hand':>7} {'files':>6} {'payload B':>10} {'sent B':>9} "
          f"{'conns':>6} {'agent calls':>12} {'cmds':>5}")
    print(f"{'by hand: scp train.py + ssh tmux kill/new':44} {base:7.0f} {1.0:7.2f} {1:6d} {'-':>10} {'-':>9} "
          f"{2:6d} {'-':>12} {2:5d}")
    print(f"{'orch first deploy (everything)':44} {'':>7} {'':>7} {first['pushed']['missing']:6d} "
          f"{first['pushed']['bytes']:10d} {first['stats']['bytes_sent']:9d} {first['stats']['connections']:6d} "
          f"{first['stats']['agent_calls']:12d} {first['stats']['commands']:5d}")
    for label, ms, out in rows:
        s, p = out["stats"], out["pushed"]
        print(f"{label:44} {ms:7.0f} {ms / base:7.2f} {p['missing']:6d} {p['bytes']:10d} {s['bytes_sent']:9d} "
              f"{s['connections']:6d} {s['agent_calls']:12d} {s['commands']:5d}")
    agent = rows[1][2]["stats"].get("agent_ms", {})
    print("time on the target per agent op (last one-line deploy, ms): "
          + ", ".join(f"{k} {v:.0f}" for k, v in sorted(agent.items(), key=lambda kv: -kv[1])))
    print("orch does strictly more than the baseline: preflight, a content-addressed push, a graceful stop, the record,"
          " and a verify_started check")


if __name__ == "__main__":
    main()
