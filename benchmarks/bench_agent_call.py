"""One agent call on the local target: this checkout's agent against another revision's, in the same run.

Every agent call that no resident agent serves (each one on the local target, one-shot calls on SSH and pct targets)
is a new interpreter running ``<root>/agent/agent-<hash>.pyz``: its bootstrap's checks, its imports, its ops. Each
agent is written to a root of its own (as a push does) and called once to unpack it; then, turn about (old, new, old,
...) so that the machine's load falls on both alike, --calls calls of each request: `hello` (the bootstrap and the
call's frame alone) and `status` as `orch status` asks it on an empty root (project, last 20, GPUs). Per call: CPU
(user + system of the agent process, which hardly moves with the machine's load) and wall, medians of --rounds
rounds, and new / old. `python -c pass` is the floor. Asserts nothing about time.
Run: python benchmarks/bench_agent_call.py [--base main] [--calls 20] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WRITE = ("import os, sys\nsys.path.insert(0, sys.argv[1])\n"
         "from orchestrator.reach.agent_client import agent_file, agent_zip\n"
         "path = agent_file(sys.argv[2])\nos.makedirs(os.path.dirname(path), 0o755, exist_ok=True)\n"
         "with open(path, 'wb') as fh:\n    fh.write(agent_zip()[1])\nos.chmod(path, 0o644)\nprint(path)\n")


def write_agent(source: Path, root: Path) -> str:
    """The agent of the orchestrator package under ``source``, written where it lives under ``root``."""
    root.mkdir(mode=0o755)
    return subprocess.run([sys.executable, "-c", WRITE, str(source), str(root)], capture_output=True, text=True,
                          check=True).stdout.strip()


def checkout(ref: str, into: Path) -> Path:
    """``ref``'s orchestrator package, unpacked under ``into``."""
    into.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "orchestrator"], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def request(root: str, ops: list[dict]) -> bytes:
    return json.dumps({"v": 1, "root": root, "ops": ops, "lock": None, "payload": 0}).encode() + b"\n"


def calls(argv: list[str], stdin: bytes, n: int) -> tuple[float, float]:
    """CPU and wall per call, in ms, of ``n`` calls of ``argv`` in turn."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    begin = time.perf_counter()
    for _ in range(n):
        res = subprocess.run(argv, input=stdin, capture_output=True)
        assert res.returncode == 0 and (not stdin or b'"ok":true' in res.stdout), res
    wall = time.perf_counter() - begin
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return cpu / n * 1000, wall / n * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="main", help="the revision to compare with (git ref)")
    ap.add_argument("--calls", type=int, default=20, help="calls of each request per round")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="orch-bench-agent-call-"))
    os.chmod(work, 0o755)
    try:
        agents = {a.base: write_agent(checkout(a.base, work / "base"), work / "root-base"),
                  "this checkout": write_agent(REPO, work / "root-new")}
        requests = {"hello": [{"op": "hello", "args": {}}],
                    "status": [{"op": "status", "args": {"project": "bench", "last": 20}}]}
        floor = [sys.executable, "-c", "pass"]
        for name, agent in agents.items():
            calls([sys.executable, agent], request(os.path.dirname(os.path.dirname(agent)), requests["hello"]), 1)
        rows: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for _ in range(a.rounds):
            rows.setdefault(("python -c pass", ""), []).append(calls(floor, b"", a.calls))
            for what, ops in requests.items():
                for name, agent in agents.items():
                    stdin = request(os.path.dirname(os.path.dirname(agent)), ops)
                    rows.setdefault((what, name), []).append(calls([sys.executable, agent], stdin, a.calls))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {key: (statistics.median(c for c, _ in got), statistics.median(w for _, w in got))
           for key, got in rows.items()}
    print(f"\nPython {sys.version.split()[0]}, {a.rounds} rounds of {a.calls} calls each, medians per call")
    print("| call | agent | CPU | wall | CPU new / old | wall new / old |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for (what, name), (cpu, wall) in med.items():
        ratio = ""
        if name == "this checkout":
            old_cpu, old_wall = med[(what, a.base)]
            ratio = f" {cpu / old_cpu:.2f} | {wall / old_wall:.2f} |"
        print(f"| {what} | {name} | {cpu:.1f} ms | {wall:.1f} ms |{ratio or ' | |'}")


if __name__ == "__main__":
    main()
