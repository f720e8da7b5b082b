"""`orch gpus` with machines that do not answer: every machine is asked at once, so the command costs about
the slowest single machine, not the sum of their timeouts.

The local target answers through the nvidia-smi stand-in (tests/testbed/nvidia_smi.py, 8 GPUs, first on PATH);
the others are SSH "hosts" on loopback that accept TCP and never answer (a frozen CT: each costs its whole
connect timeout). Medians over --runs of:
  - `orch gpus --target local` (8 GPUs read);
  - `orch gpus --target dead1` (one machine that does not answer);
  - `orch gpus` over the local target and --dead silent ones; its ratio to the slowest single.
Run: python benchmarks/bench_gpus.py [--runs N] [--dead 6] [--timeout 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_status_all import median_s, silent_listener  # noqa: E402


def main() -> None:
    from tests.testbed.gpu_standin import gpu_state, install_local

    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dead", type=int, default=6)
    ap.add_argument("--timeout", type=float, default=2.0)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="orch-bench-gpus-"))
    listeners = [silent_listener() for _ in range(a.dead)]
    env = install_local(work / "smi", gpu_state(8))
    os.environ.update(env)
    try:
        dead = "".join(f'\n[targets.dead{i + 1}]\nkind = "ssh"\nhost = "127.0.0.1"\nport = {port}\nuser = "root"\n'
                       for i, (_, port) in enumerate(listeners))
        (work / "orch.toml").write_text(
            f'default_target = "local"\n[project]\nname = "bench"\ncommand = "python3 -c pass"\n'
            f'[targets.local]\nkind = "local"\nroot = "{work}/target"\ncheckpoints = "{work}/target/ckpt"\n'
            f'[ssh]\nconnect_timeout = {a.timeout}\nconnect_retries = 0\nknown_hosts = ["{work}/known_hosts"]\n'
            + dead)
        (work / "known_hosts").write_text("")
        orch = [sys.executable, "-m", "orchestrator.cli.main", "gpus"]
        local, out = median_s([*orch, "--target", "local"], work, a.runs)
        assert out.count("NVIDIA H100") == 8, out
        one_dead, _ = median_s([*orch, "--target", "dead1"], work, a.runs)
        every, out = median_s(orch, work, a.runs)
        assert out.count("NVIDIA H100") == 8, out
        slowest = max(one_dead, local)
        print(f"\n| case (medians of {a.runs}) | wall | x slowest single |\n|---|---|---|")
        print(f"| gpus, local target (8 GPUs, stand-in) | {local:.2f} s | {local / slowest:.2f} |")
        print(f"| gpus, one silent machine (connect timeout {a.timeout:g} s) | {one_dead:.2f} s | "
              f"{one_dead / slowest:.2f} |")
        print(f"| gpus: local + {a.dead} silent | {every:.2f} s | {every / slowest:.2f} |")
        print(f"\nsequential would be about {local + a.dead * one_dead:.2f} s")
    finally:
        for srv, _ in listeners:
            srv.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
