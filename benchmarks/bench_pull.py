"""`orch pull` of a run's checkpoints from a real LXC container against `scp -r` and `rsync` of the same folder.

Stands up the test suite's LXC testbed (needs root, LXC, and rsync on this machine; the CT image has it), runs
an experiment on CT 200 over SSH that writes ``--gib`` GiB of random checkpoints (64 MiB files), and measures in
the same run, each to an empty folder here:
  - `scp -r root@ct:<checkpoints> dest` (OpenSSH, no hashing);
  - `rsync -a -e ssh root@ct:<checkpoints>/ dest/` (whole files: nothing is here yet);
  - `orch pull -e 1 --checkpoints --to dest` (listing, sending, sha256 on both sides, .part then rename);
  - a second `orch pull` of the unchanged folder (nothing sent), and a second `rsync` for comparison;
  - the peak resident memory (VmHWM) of the orch process during the first pull.
Run as root: python benchmarks/bench_pull.py [--gib 1] [--runs 3]
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

ROOT = "/workspace/orch-bench"
CKPT = "/workspace/bench-checkpoints"
TRAIN = """\
import os, pathlib
ck = pathlib.Path(os.environ["ORCH_CHECKPOINT_DIR"])
ck.mkdir(parents=True, exist_ok=True)
for i in range(int(os.environ["BENCH_FILES"])):
    (ck / f"ckpt-{i:04d}.pt").write_bytes(os.urandom(64 << 20))
print("step=1 loss=1.0", flush=True)
"""


CUTS: list[str] = []  # pulls whose link dropped on its own: the time counts the rerun that resumed them


def timed(argv: list[str], cwd: Path) -> tuple[float, int]:
    """Run ``argv`` (a cut ``orch pull`` again, as a user would); its wall time and its peak RSS (KiB)."""
    from tests.testbed.procs import peak_kb

    begin = time.perf_counter()
    peak = 0
    for _attempt in range(3):
        proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        while proc.poll() is None:
            peak = max(peak, peak_kb(proc.pid))
            time.sleep(0.01)
        _out, err = proc.communicate()
        if proc.returncode == 0:
            return time.perf_counter() - begin, peak
        if b"the pull was cut" not in err:
            break
        CUTS.append(err.decode().splitlines()[0])
    raise SystemExit(f"{' '.join(argv)} failed: {err.decode()}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0, help="checkpoint folder size in GiB")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    from tests.integration.conftest import Testbed
    from tests.testbed import lxc

    work = Path(tempfile.mkdtemp(prefix="orch-bench-pull-"))
    (work / "bed").mkdir()
    with lxc.session_lock():
        bed = Testbed(work / "bed")
        try:
            bed.setup()
            bed.reset(200)
            rows = measure(bed, work, a.gib, a.runs)
        finally:
            bed.teardown()
            shutil.rmtree(work, ignore_errors=True)
    base = rows["scp -r"]
    print(f"\npull of {a.gib:g} GiB of checkpoints (64 MiB files) from CT 200 over the testbed bridge; "
          f"medians of {a.runs} run(s)")
    print(f"{'what':<34} {'s':>7} {'MB/s':>7} {'x scp':>6} {'x rsync':>8}")
    for name, seconds in rows.items():
        rate = f"{a.gib * 1024 / seconds:7.0f}" if "second" not in name else f"{'-':>7}"
        print(f"{name:<34} {seconds:7.2f} {rate} {seconds / base:6.2f} {seconds / rows['rsync -a']:8.2f}")
    print(f"peak RSS of orch during the first pull: {rows_peak[0] >> 10} MiB")
    for cut in CUTS:
        print(f"a pull was cut on its own and resumed by running it again: {cut}")


rows_peak = [0]


def measure(bed, work: Path, gib: float, runs: int) -> dict:
    ct = bed.ct(200)
    proj = work / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(TRAIN)
    files = max(1, int(gib * 16))
    (proj / "orch.toml").write_text(f"""\
default_target = "ssh200"
[project]
name = "bench"
sources = ["train.py"]
command = "python3 train.py"
env = {{ BENCH_FILES = "{files}" }}
[paths]
root = "{ROOT}"
checkpoints = "{CKPT}"
{bed.access_toml(work / "trusted", proxmox=False)}[targets.ssh200]
kind = "ssh"
host = "{ct.address}"
user = "root"
""")
    orch = [sys.executable, "-m", "orchestrator.cli.main"]
    subprocess.run([*orch, "deploy"], cwd=proj, check=True, capture_output=True)
    exit_file = next((ct.delta / ROOT.lstrip("/") / "runs").glob("*-1")) / "exit.json"
    while not exit_file.exists():
        time.sleep(0.2)
    ssh = " ".join(["ssh", *bed.ssh_options()])
    remote = f"root@{ct.address}:{CKPT}"
    dest = work / "dest"
    argvs = {
        "scp -r": ["scp", "-q", "-r", *bed.ssh_options(), remote, str(dest)],
        "rsync -a": ["rsync", "-a", "-e", ssh, remote + "/", str(dest) + "/"],
        "orch pull": [*orch, "pull", "-e", "1", "--checkpoints", "--to", str(dest)],
    }
    times: dict[str, list[float]] = {name: [] for name in [*argvs, "rsync -a, second (nothing new)",
                                                           "orch pull, second (nothing new)"]}
    for _ in range(runs):
        for name, argv in argvs.items():
            shutil.rmtree(dest, ignore_errors=True)
            seconds, peak = timed(argv, proj)
            times[name].append(seconds)
            if name == "orch pull":
                rows_peak[0] = max(rows_peak[0], peak)
                times["orch pull, second (nothing new)"].append(timed(argv, proj)[0])
            if name == "rsync -a":
                times["rsync -a, second (nothing new)"].append(timed(argv, proj)[0])
    total = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file() and not p.name.startswith("."))
    if total != files << 26:
        raise SystemExit(f"orch pull brought {total} bytes, not {files << 26}")
    return {name: statistics.median(t) for name, t in times.items()}


if __name__ == "__main__":
    main()
