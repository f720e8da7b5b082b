"""What a run's start costs for a large tree: the agent's ``runs.start`` (work folder, files, tmux) on a
revision of N files, and the work folder's part of it alone.

    python benchmarks/bench_workdir.py               # 2000 files in 20 folders, 15 starts
    python benchmarks/bench_workdir.py --files 20000 --repeat 5

Each start gets a fresh run folder; the median and the spread are printed, never asserted.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.agent.run import runs  # noqa: E402
from orchestrator.agent.store import revisions
from orchestrator.agent.layout import Layout  # noqa: E402
from orchestrator.agent.protocol import manifest_id  # noqa: E402


def _revision(layout: Layout, count: int) -> str:
    layout.ensure()
    files = []
    for i in range(count):
        data = f"# module {i}\nVALUE = {i}\n".encode()
        sha = hashlib.sha256(data).hexdigest()
        Path(layout.blob(sha)).write_bytes(data)
        os.chmod(layout.blob(sha), 0o444)
        files.append({"path": f"pkg{i % 20}/m{i}.py", "sha256": sha, "mode": 0o644, "size": len(data)})
    rev = manifest_id(files)
    revisions.revision_assemble(layout, rev, files)
    return rev


def _ms(samples: list[float]) -> str:
    q = statistics.quantiles(samples, n=4) if len(samples) > 1 else samples * 3
    return f"median {statistics.median(samples) * 1000:.1f} ms (quartiles {q[0] * 1000:.1f}-{q[2] * 1000:.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        layout = Layout(os.path.join(tmp, "root"))
        rev = _revision(layout, args.files)
        builds, starts = [], []
        try:
            from orchestrator.agent.run import workdir
        except ImportError:  # an orch from before work folders: the start alone, for comparison
            workdir = None
        for n in range(args.repeat if workdir else 0):
            run_dir = os.path.join(layout.runs, f"b-{n}")
            os.makedirs(run_dir)
            t0 = time.perf_counter()
            workdir.build(layout, run_dir, rev)
            builds.append(time.perf_counter() - t0)
        sock = ["tmux", "-L", runs.socket_name(layout)]
        subprocess.run([*sock, "new-session", "-d", "-s", "keep", "sleep", "3600"], check=True)  # server stays up
        for n in range(args.repeat):
            t0 = time.perf_counter()
            runs.start(layout, n + 1, "bench", rev, ["true"], {}, {"project": "bench"}, {}, "/nonexistent.pyz")
            starts.append(time.perf_counter() - t0)
            runs.not_started(layout.run_dir(n + 1), "bench")  # ended: the next start may go
        subprocess.run([*sock, "kill-server"], capture_output=True)
    built = f"work folder {_ms(builds)}; " if builds else ""
    print(f"{args.files} files: {built}whole runs.start {_ms(starts)}")


if __name__ == "__main__":
    main()
