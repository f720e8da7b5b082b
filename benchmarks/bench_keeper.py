"""Repeat commands through the connection keeper on a real CT, against what a user types by hand, in one run.

Stands up the LXC testbed (root and LXC; the base image is cached) and measures on CT 200, medians over --runs:
  - by hand: `scp train.py ct: && ssh ct "tmux kill-session; tmux new -d …"`, without and with an OpenSSH
    ControlMaster held (ControlPersist);
  - `orch deploy` of a one-line change: cold (no keeper running: each run closes the keepers first) against the
    plain hand-typed pair, and warm (keeper and resident agent up) against the ControlMaster pair;
  - `orch status`, cold and warm, and with both off (`[ssh] persist = 0`, `ORCH_WARM=0`) for reference;
  - `orch --help` against `python -c pass`;
  - where one more warm deploy spends its time on the target (per agent op) and how many agent calls it makes.
Every command is the installed `orch` script, as a user types it: warm means the connection keeper, its resident
agent and the warm orch process are up; cold means none is (each run closes them first).
Prints one table with each case's bar. Asserts nothing. Run as root: python benchmarks/bench_keeper.py [--runs N]
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


def median_ms(fn, runs: int, before=None) -> float:
    times = []
    for i in range(runs):
        if before is not None:
            before()
        t = time.perf_counter()
        fn(i)
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    a = ap.parse_args()
    from tests.integration.conftest import Testbed

    work = Path(tempfile.mkdtemp(prefix="orch-bench-keeper-"))
    (work / "bed").mkdir()
    bed = Testbed(work / "bed")
    runtime = tempfile.mkdtemp(prefix="orch-rt-")
    os.environ["XDG_RUNTIME_DIR"] = runtime  # keepers of this benchmark only
    try:
        bed.setup()
        bed.reset(200)
        run(bed, work, a.runs)
    finally:
        from orchestrator.reach.keeper import client
        from orchestrator.warm import client as warm_client

        warm_client.close()
        client.close(None)
        bed.teardown()


def run(bed, work: Path, runs: int) -> None:
    from orchestrator.reach.keeper import client
    from orchestrator.warm import client as warm_client

    ct = bed.ct(200)
    proj = work / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(TRAIN.format(n=0))
    (proj / "orch.toml").write_text(f"""\
default_target = "ssh200"
[project]
name = "bench"
sources = ["train.py"]
command = "python3 train.py"
[paths]
root = "/workspace/orch"
checkpoints = "/workspace/checkpoints"
{bed.access_toml(work / "trusted", proxmox=False)}[targets.ssh200]
kind = "ssh"
host = "{ct.address}"
user = "root"
""")
    env = dict(os.environ)

    script = str(Path(sys.executable).parent / "orch")

    def orch(*args: str, extra: dict | None = None) -> str:
        out = subprocess.run([script, *args], cwd=proj, env=dict(env, **(extra or {})), capture_output=True,
                             text=True)
        if out.returncode != 0:
            raise SystemExit(f"orch {' '.join(args)} failed: {out.stderr}")
        return out.stdout

    def changed(i: int, extra: dict | None = None) -> None:
        (proj / "train.py").write_text(TRAIN.format(n=time.time_ns()))
        orch("deploy", extra=extra)

    def keeper_up() -> None:
        orch("status")
        deadline = time.monotonic() + 30
        while not (client.keepers() and warm_client.processes()):
            if time.monotonic() > deadline:
                raise SystemExit("no keeper started")
            time.sleep(0.05)
        orch("status")  # the keeper's connection and resident agent are up

    orch("deploy")
    dest = f"root@{ct.address}"
    opts = bed.ssh_options()
    master = ["-o", "ControlMaster=auto", "-o", f"ControlPath={work}/cm-%r@%h:%p", "-o", "ControlPersist=120"]

    def by_hand(i: int, extra: list[str] = ()) -> None:
        (proj / "train.py").write_text(TRAIN.format(n=1000 + i))
        subprocess.run(["scp", "-q", *opts, *extra, str(proj / "train.py"), f"{dest}:train.py"], check=True)
        subprocess.run(["ssh", *opts, *extra, dest, "tmux kill-session -t train; tmux new -d -s train python3 "
                        "train.py"], check=True, capture_output=True)

    hand = median_ms(by_hand, runs)
    by_hand(0, master)  # the master is up
    hand_cm = median_ms(lambda i: by_hand(i, master), runs)
    subprocess.run(["ssh", *opts, *master, "-O", "exit", dest], capture_output=True)
    subprocess.run(["ssh", *opts, dest, "tmux kill-server"], capture_output=True)

    close = lambda: (warm_client.close(), client.close(None))  # noqa: E731
    cold_deploy = median_ms(changed, runs, before=close)
    off = {"ORCH_SSH__PERSIST": "0", "ORCH_WARM": "0"}
    direct_deploy = median_ms(lambda i: changed(i, off), runs)
    keeper_up()
    warm_deploy = median_ms(changed, runs)
    (proj / "train.py").write_text(TRAIN.format(n=time.time_ns()))
    profile = json.loads(orch("deploy", "--json"))["stats"]  # where a warm deploy's time goes on the target
    cold_status = median_ms(lambda i: orch("status"), runs, before=close)
    direct_status = median_ms(lambda i: orch("status", extra=off), runs)
    keeper_up()
    warm_status = median_ms(lambda i: orch("status"), runs)
    bare = median_ms(lambda i: subprocess.run([sys.executable, "-c", "pass"], check=True), runs)
    helped = median_ms(lambda i: subprocess.run([script, "--help"], capture_output=True, check=True), runs)
    helped_cold = median_ms(lambda i: subprocess.run([script, "--help"], capture_output=True, check=True,
                                                     env=dict(env, ORCH_WARM="0")), runs)
    orch("stop")

    rows = [
        ("by hand: scp + ssh tmux", hand, "", ""),
        ("by hand, ControlMaster held", hand_cm, "", ""),
        ("orch deploy, 1 line, cold (no keeper)", cold_deploy, f"{cold_deploy / hand:.2f}x hand", "<= 0.8x"),
        ("orch deploy, 1 line, keeper and warm off", direct_deploy, f"{direct_deploy / hand:.2f}x hand", ""),
        ("orch deploy, 1 line, warm (keeper)", warm_deploy, f"{warm_deploy / hand_cm:.2f}x hand+CM",
         "<= 3x, <= 150 ms"),
        ("orch status, cold (no keeper)", cold_status, "", ""),
        ("orch status, keeper and warm off", direct_status, "", ""),
        ("orch status, warm", warm_status, f"{warm_status / direct_status:.2f}x off", "<= 100 ms"),
        ("python -c pass", bare, "", ""),
        ("orch --help, warm", helped, f"{helped / bare:.2f}x python", "<= 3x"),
        ("orch --help, ORCH_WARM=0", helped_cold, f"{helped_cold / bare:.2f}x python", ""),
    ]
    print(f"CT 200 over the testbed bridge; medians of {runs} runs; {os.cpu_count()} CPUs")
    print(f"{'case':42} {'ms':>8} {'ratio':>22} {'bar':>18}")
    for label, ms, ratio, bar in rows:
        print(f"{label:42} {ms:8.0f} {ratio:>22} {bar:>18}")
    print(f"warm deploy: {profile['agent_calls']} agent calls, {profile['connections']} new SSH connections; "
          "ms on the target per op: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(profile["agent_ms"].items(),
                                                                               key=lambda kv: -kv[1]) if v >= 1))
    print(f"load average at the end: {open('/proc/loadavg').read().split()[0]}")


if __name__ == "__main__":
    main()
