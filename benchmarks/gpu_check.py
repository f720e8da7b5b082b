"""On a machine with real NVIDIA GPUs: what orch finds and does with them, printed, never asserted.

    python benchmarks/gpu_check.py [--gpus 1] [--seconds 20]

In a throw-away project on the local target it runs `orch gpus` (and `orch doctor` where this orch has it),
then `orch deploy --gpus N --wait` of a short CUDA run (torch: a matmul loop on every visible GPU), `orch gpus`
and `orch status` while the run holds its GPUs, and the run's log: which GPUs it was given, what torch saw
and how fast the loop went. The run is stopped and the project removed at the end.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

RUN = '''\
import os, sys, time
print("CUDA_VISIBLE_DEVICES=" + os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"), flush=True)
try:
    import torch
except ImportError:
    sys.exit("torch is not installed for this python: no CUDA run")
print(f"torch {torch.__version__} cuda available={torch.cuda.is_available()} devices={torch.cuda.device_count()}",
      flush=True)
if not torch.cuda.is_available():
    sys.exit(1)
end = time.time() + float(os.environ.get("CHECK_SECONDS", "20"))
xs = [torch.randn(4096, 4096, device=f"cuda:{i}") for i in range(torch.cuda.device_count())]
step = 0
while time.time() < end:
    t = time.time()
    for x in xs:
        (x @ x).sum().item()
    step += 1
    if step % 20 == 0:
        tflops = 2 * 4096 ** 3 * len(xs) / (time.time() - t) / 1e12
        print(f"step={step} loss={1.0 / step:.4f} tflops={tflops:.1f}", flush=True)
print("done", flush=True)
'''


def orch(work: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    res = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], cwd=work, capture_output=True,
                         text=True, timeout=timeout)
    print(f"\n$ orch {' '.join(args)}   (exit {res.returncode})")
    print((res.stdout + res.stderr).rstrip())
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=20)
    a = ap.parse_args()
    smi = shutil.which("nvidia-smi")
    print(f"nvidia-smi: {smi or 'not on PATH'}")
    if smi:
        print(subprocess.run([smi, "-L"], capture_output=True, text=True).stdout.rstrip())
    work = Path(tempfile.mkdtemp(prefix="orch-gpu-check-"))
    try:
        (work / "check.py").write_text(RUN)
        (work / "orch.toml").write_text(
            f'default_target = "local"\n[project]\nname = "gpucheck"\nsources = ["check.py"]\n'
            f'command = "{sys.executable} check.py"\nenv = {{ CHECK_SECONDS = "{a.seconds:g}" }}\n'
            f'[targets.local]\nkind = "local"\nroot = "{work}/target"\ncheckpoints = "{work}/target/ckpt"\n')
        orch(work, "gpus")
        if orch(work, "doctor", "--help").returncode == 0:
            orch(work, "doctor")
        began = time.monotonic()
        deployed = orch(work, "deploy", "--gpus", str(a.gpus), f"--wait={a.seconds + 30:g}")
        print(f"\ndeploy returned after {time.monotonic() - began:.1f} s")
        if deployed.returncode == 0:
            orch(work, "gpus")
            orch(work, "status")
            time.sleep(max(0.0, a.seconds - (time.monotonic() - began)) + 2)
        orch(work, "logs", "-e", "1")
        orch(work, "experiments", "show", "1")
    finally:
        subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "stop"], cwd=work, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
