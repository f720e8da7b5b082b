"""On a machine with real NVIDIA GPUs: what orch sees of them, and a short CUDA run placed by orch.

    python benchmarks/gpu_check.py                 # every GPU: a 4096x4096 matmul, 20 times on each
    python benchmarks/gpu_check.py --gpus 1 --size 8192 --repeat 50 --hold 10

In a scratch project on the local target it runs ``orch gpus`` and ``orch doctor``, then
``orch deploy --gpus N --wait`` of a short run: a torch matmul on each GPU it was given (TFLOPS, its result
checked against the CPU), or, without torch, ``nvidia-smi`` and a tiny CUDA program compiled with ``nvcc``
(a vector add, checked). While the run holds its GPUs (``--hold`` s) ``orch gpus`` and ``orch status`` show
them; then the run's log and how it ended. It prints what each step found, never asserts a speed. On a
machine without NVIDIA GPUs it says so and exits 1; it exits 1 too when a step fails, so a script can tell.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = r'''
import json, os, shutil, subprocess, sys, tempfile, time

SIZE, REPEAT, HOLD = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
print("visible:", os.environ.get("CUDA_VISIBLE_DEVICES", "(all)"), flush=True)
try:
    import torch
except ImportError:
    torch = None
if torch is not None and torch.cuda.is_available():
    for i in range(torch.cuda.device_count()):
        dev = torch.device("cuda", i)
        a = torch.randn(SIZE, SIZE, device=dev)
        b = torch.randn(SIZE, SIZE, device=dev)
        c = a @ b
        torch.cuda.synchronize(dev)
        begin = time.perf_counter()
        for _ in range(REPEAT):
            c = a @ b
        torch.cuda.synchronize(dev)
        took = time.perf_counter() - begin
        small = a[:64].cpu() @ b[:, :64].cpu()
        ok = torch.allclose(c[:64, :64].cpu(), small, rtol=1e-2, atol=1e-1)
        print("GPU " + json.dumps({"index": i, "name": torch.cuda.get_device_name(i), "seconds": round(took, 4),
                                   "tflops": round(2 * SIZE ** 3 * REPEAT / took / 1e12, 1), "correct": bool(ok)}),
              flush=True)
    print("step=1 loss=1.0", flush=True)  # deploy --wait returns here, with the GPUs still held
    time.sleep(HOLD)
    sys.exit(0)
why = "torch is not installed" if torch is None else "torch sees no CUDA device"
print("no torch run:", why, flush=True)
smi = subprocess.run(["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total",
                      "--format=csv,noheader"], capture_output=True, text=True)
print("nvidia-smi:", smi.stdout.strip() or smi.stderr.strip(), flush=True)
nvcc = shutil.which("nvcc") or (os.path.exists("/usr/local/cuda/bin/nvcc") and "/usr/local/cuda/bin/nvcc")
if not nvcc:
    print("CUDA " + json.dumps({"ran": False, "why": why + " and nvcc is not installed"}), flush=True)
    sys.exit(3)
src = r"""
#include <cstdio>
__global__ void add(int n, const float *x, float *y) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] += x[i]; }
int main() {
  int n = 1 << 20, count = 0; float *x, *y;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) { printf("no device\n"); return 2; }
  for (int d = 0; d < count; d++) {
    cudaSetDevice(d); cudaMallocManaged(&x, n * sizeof(float)); cudaMallocManaged(&y, n * sizeof(float));
    for (int i = 0; i < n; i++) { x[i] = 1.0f; y[i] = 2.0f; }
    add<<<(n + 255) / 256, 256>>>(n, x, y); cudaError_t e = cudaDeviceSynchronize();
    int bad = 0; for (int i = 0; i < n; i++) bad += y[i] != 3.0f;
    printf("device %d: %s, %d wrong of %d\n", d, cudaGetErrorString(e), bad, n);
    cudaFree(x); cudaFree(y); if (e != cudaSuccess || bad) return 1;
  }
  return 0;
}
"""
folder = tempfile.mkdtemp()
with open(os.path.join(folder, "add.cu"), "w") as fh:
    fh.write(src)
built = subprocess.run([nvcc, "-o", os.path.join(folder, "add"), os.path.join(folder, "add.cu")],
                       capture_output=True, text=True)
if built.returncode != 0:
    print("CUDA " + json.dumps({"ran": False, "why": "nvcc failed: " + built.stderr[-500:]}), flush=True)
    sys.exit(3)
ran = subprocess.run([os.path.join(folder, "add")], capture_output=True, text=True)
print("CUDA " + json.dumps({"ran": True, "ok": ran.returncode == 0, "output": ran.stdout.strip()}), flush=True)
sys.exit(0 if ran.returncode == 0 else 1)
'''


def orch(project: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """The orch CLI of this checkout in ``project``; the local target's root in the scratch folder beside it."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), XDG_DATA_HOME=str(project.parent / "data"))
    return subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], cwd=project, capture_output=True,
                          text=True, timeout=timeout, env=env)


def gpus_here() -> tuple[list[str], str | None]:
    """This machine's GPUs by ``nvidia-smi -L``, or why there are none."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return [], "nvidia-smi is not installed"
    got = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    lines = [ln for ln in got.stdout.splitlines() if ln.startswith("GPU ")]
    if got.returncode != 0 or not lines:
        return [], (got.stdout + got.stderr).strip().splitlines()[0] if (got.stdout + got.stderr).strip() \
            else f"nvidia-smi -L exited {got.returncode}"
    return lines, None


def section(title: str, text: str) -> None:
    print(f"\n== {title}")
    print(textwrap.indent(text.rstrip() or "(nothing)", "   "))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--gpus", type=int, default=0, help="GPUs to place the run on (default: all)")
    parser.add_argument("--hold", type=float, default=5.0, help="seconds the run keeps its GPUs after the matmul")
    args = parser.parse_args()
    lines, why = gpus_here()
    if not lines:
        print(f"no NVIDIA GPU on this machine ({why}): this check needs one", file=sys.stderr)
        return 1
    section("nvidia-smi -L", "\n".join(lines))
    problems = []
    with tempfile.TemporaryDirectory(prefix="orch-gpu-check-") as tmp:
        project = Path(tmp) / "gpucheck"
        project.mkdir()
        (project / "probe.py").write_text(PROBE)
        made = orch(project, "init")
        if made.returncode != 0:
            print(made.stdout + made.stderr, file=sys.stderr)
            return 1
        toml = (project / "orch.toml").read_text()
        toml = toml.replace('sources = ["train.py"]', 'sources = ["probe.py"]').replace(
            'command = "python3 train.py"',
            f'command = "{sys.executable} probe.py {args.size} {args.repeat} {args.hold:g}"')
        (project / "orch.toml").write_text(toml)

        listed = orch(project, "gpus")
        section(f"orch gpus (exit {listed.returncode})", listed.stdout + listed.stderr)
        if listed.returncode != 0:
            problems.append("orch gpus failed")
        doctor = orch(project, "doctor")
        section(f"orch doctor (exit {doctor.returncode})", doctor.stdout + doctor.stderr)
        report = json.loads(orch(project, "doctor", "--json").stdout or "{}")
        if report.get("status") == "fail":
            problems.append("orch doctor found failures")
        wanted = args.gpus or len(lines)
        deployed = orch(project, "deploy", "--gpus", str(wanted), "--wait=300", "-m", "gpu check")
        section(f"orch deploy --gpus {wanted} --wait (exit {deployed.returncode})", deployed.stdout + deployed.stderr)
        if deployed.returncode != 0:
            problems.append("the deploy failed")
        else:
            held = orch(project, "gpus")
            section("orch gpus, while the run holds its GPUs", held.stdout + held.stderr)
            shown = orch(project, "status", "--no-metrics")
            section("orch status", shown.stdout + shown.stderr)
            followed = orch(project, "logs", "--follow", "-n", "1000")
            section("the run's log (orch logs --follow)", followed.stdout + followed.stderr)
            status = json.loads(orch(project, "status", "--json", "--no-metrics").stdout or "{}")
            section("how it ended", f"state {status.get('state')}, exit code {status.get('exit_code')}")
            results = [json.loads(ln[4:]) for ln in followed.stdout.splitlines() if ln.startswith("GPU {")]
            cuda = [json.loads(ln[5:]) for ln in followed.stdout.splitlines() if ln.startswith("CUDA {")]
            if results:
                print(f"\n   {'gpu':>3}  {'name':<28} {'TFLOPS':>7}  correct")
                for r in results:
                    print(f"   {r['index']:>3}  {r['name']:<28} {r['tflops']:>7}  {r['correct']}")
                if len(results) < wanted or not all(r["correct"] for r in results):
                    problems.append(f"torch ran on {len(results)} of the {wanted} GPUs placed, or got a wrong product")
            elif not (cuda and cuda[0].get("ok")):
                problems.append("no CUDA run succeeded")
    print()
    if problems:
        print("PROBLEMS: " + "; ".join(problems))
        return 1
    print(f"OK: {len(lines)} GPU(s) seen by orch gpus and orch doctor, and a CUDA run on the {wanted} placed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
