"""Following and reading logs on the local target: latency, bytes per line, and status on a big log.

1. Latency from a line being written to the run's log to it being printed, for ``orch logs
   --follow`` (the real CLI: streamed), the follower in-process streamed and polling (a transport
   that cannot stream, at the old CLI poll of 0.3 s and at 0.1 s), and ``tail -F`` on the same file
   as the baseline; all follow the same paced run at once.
2. Bytes the transport carried per followed line: a high-rate run and the paced run, against the
   log's own bytes per line.
3. ``orch status`` on a run with a 1M-line log: without the metrics refresh, the calls needed to
   ingest the whole log, and the ingestion rate against the bare parser on the same lines.

Prints tables; asserts nothing about time.
Run: python benchmarks/bench_follow.py [--lines 200] [--interval 0.02] [--spew 200000] [--big 1000000]
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
import threading
import time
from pathlib import Path

PACE = """\
import os, random, sys, time
go = os.path.join(os.environ["ORCH_RUN_DIR"], "go")
while not os.path.exists(go):
    time.sleep(0.01)
n, interval = int(sys.argv[1]), float(sys.argv[2])
rng = random.Random(0)
for i in range(n):
    time.sleep(interval * rng.uniform(0.5, 1.5))
    os.write(1, f"paced {i} t={time.time():.6f}\\n".encode())
time.sleep(0.5)
"""

SPEW = """\
import sys
n, out = int(sys.argv[1]), sys.stdout
for start in range(0, n, 1000):
    out.write("".join(f"step={i} loss={3 - i / n:.4f} tok/s={12000 + i % 977} lr=3.0e-04 epoch=0 tokens={i * 4096}\\n"
                      for i in range(start, min(n, start + 1000))))
    out.flush()
"""


def orch(work: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], cwd=work, capture_output=True,
                          text=True, check=check)


def deploy(work: Path, script: str, *argv: str) -> int:
    cmd = "python3 " + " ".join([script, *argv])
    res = orch(work, "deploy", "--json", "--set", f"project.sources=['{script}']", "--set", f"project.command={cmd}")
    return json.loads(res.stdout)["experiment"]["id"]


def wait_ended(run: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not (run / "exit.json").exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"{run} did not end within {timeout:.0f} s")
        time.sleep(0.05)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _stamps(lines: list[tuple[float, bytes]]) -> list[float]:
    """Latency in ms of each ``paced i t=...`` line: received minus written."""
    out = []
    for got, line in lines:
        if line.startswith(b"paced "):
            out.append((got - float(line.rsplit(b"t=", 1)[1])) * 1000)
    return out


def _read_lines(stream, sink: list, stop_after: int | None = None, on_stop=None) -> None:
    for line in iter(stream.readline, b""):
        sink.append((time.time(), line))
        if stop_after is not None and len(sink) >= stop_after and on_stop:
            on_stop()


def run_dir(work: Path, exp: int) -> Path:
    from orchestrator.records.experiments import Registry

    with Registry(work / ".orch" / "experiments.db") as reg:
        return work / "target" / "runs" / f"{reg.registry_id}-{exp}"


def polling(target):
    """The target, reached by a local transport that cannot stream: the follower polls."""
    import dataclasses

    from orchestrator.reach.transport.local import LocalTransport

    class Polled(LocalTransport):
        streams = False

    return dataclasses.replace(target, connect=Polled)


def latency(work: Path, settings, target, n: int, interval: float) -> tuple[list, dict]:
    from orchestrator.records.experiments import Registry
    from orchestrator.watch.follow import follow

    exp = deploy(work, "pace.py", str(n), str(interval))
    run = run_dir(work, exp)
    log = run / "train.log"
    with Registry(work / ".orch" / "experiments.db") as reg:
        registry = reg.registry_id
    cli = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "logs", "--follow", "-n", "0"], cwd=work,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    tail = subprocess.Popen(["tail", "-F", "-n", "+1", str(log)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    got_cli: list = []
    got_tail: list = []
    followers = {"streamed": (target, 0.3), "poll 0.3 s": (polling(target), 0.3),
                 "poll 0.1 s": (polling(target), 0.1)}
    got: dict[str, list] = {name: [] for name in followers}
    result: dict = {}

    def follower(name: str) -> None:
        buf = bytearray()

        def write(data: bytes) -> None:
            now = time.time()
            buf.extend(data)
            *lines, rest = bytes(buf).split(b"\n")
            buf[:] = rest
            got[name].extend((now, line + b"\n") for line in lines)

        how, poll = followers[name]
        result[name] = follow(settings, how, exp, write=write, notice=lambda m: None, follow=True, tail_lines=0,
                              poll=poll, registry=registry)

    threads = [threading.Thread(target=_read_lines, args=(cli.stdout, got_cli)),
               threading.Thread(target=_read_lines, args=(tail.stdout, got_tail, n, tail.terminate)),
               *(threading.Thread(target=follower, args=(name,)) for name in followers)]
    for t in threads:
        t.start()
    time.sleep(3.0)  # every follower is up (its first read made, its stream started) before the first line
    (run / "go").touch()
    for t in threads:
        t.join(n * interval * 3 + 60)
    cli.wait(30)
    rows = [("tail -F (baseline)", _stamps(got_tail)), ("orch logs --follow (CLI, streamed)", _stamps(got_cli)),
            *((f"follow() in-process, {name}", _stamps(got[name])) for name in followers)]
    return rows, {"lines": n, "log_bytes": log.stat().st_size, "result": result["streamed"],
                  "polled": result["poll 0.1 s"]}


def high_rate(work: Path, settings, target, n: int) -> dict:
    from orchestrator.watch.follow import follow

    exp = deploy(work, "spew.py", str(n))
    run = run_dir(work, exp)
    count = [0]

    def write(data: bytes) -> None:
        count[0] += data.count(b"\n")

    t0 = time.perf_counter()
    res = follow(settings, target, exp, write=write, notice=lambda m: None, follow=True, tail_lines=10**9,
                 registry=run.name.rsplit("-", 1)[0])
    took = time.perf_counter() - t0
    return {"lines": count[0], "log_bytes": (run / "train.log").stat().st_size, "result": res, "seconds": took}


def status_on_big_log(work: Path, n: int) -> dict:
    from orchestrator.watch.metrics import Parser

    orch(work, "experiments", "compare", "1", "2")  # the earlier runs' metrics complete: status reads only this one
    exp = deploy(work, "spew.py", str(n))
    run = run_dir(work, exp)
    wait_ended(run)
    log = run / "train.log"

    def timed(*args: str) -> tuple[float, dict]:
        t0 = time.perf_counter()
        out = json.loads(orch(work, "status", "--json", *args).stdout)
        return (time.perf_counter() - t0) * 1000, out

    without = statistics.median(timed("--no-metrics")[0] for _ in range(3))
    calls = []
    while True:
        ms, out = timed()
        calls.append(ms)
        behind = any("the rest on the next refresh" in note for note in out["summary"].get("notes", []))
        if not behind or len(calls) > 100:
            break
    steady = statistics.median(timed()[0] for _ in range(3))
    lines = log.read_text().splitlines()
    t0 = time.perf_counter()
    Parser().parse_lines(lines)
    parse_s = time.perf_counter() - t0
    return {"lines": len(lines), "mb": log.stat().st_size / 1e6, "without_ms": without, "calls": calls,
            "steady_ms": steady, "parse_s": parse_s, "step": out["summary"].get("step")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=200, help="paced lines for the latency test")
    ap.add_argument("--interval", type=float, default=0.02, help="mean seconds between paced lines")
    ap.add_argument("--spew", type=int, default=200_000, help="lines of the high-rate run")
    ap.add_argument("--big", type=int, default=1_000_000, help="lines of the log status reads")
    a = ap.parse_args()
    from orchestrator.config import load_settings
    from orchestrator.reach.targets import resolve_target

    work = Path(tempfile.mkdtemp(prefix="orch-bench-follow-"))
    root = work / "target"
    (work / "pace.py").write_text(PACE)
    (work / "spew.py").write_text(SPEW)
    (work / "orch.toml").write_text(
        f'[project]\nname = "benchfollow"\nsources = ["pace.py"]\ncommand = "python3 pace.py"\n'
        f'[run]\nstop_timeout = 2\n[targets.local]\nkind = "local"\nroot = "{root}"\n'
        f'checkpoints = "{root}/checkpoints"\n')
    settings = load_settings(work / "orch.toml")
    target = resolve_target(settings)
    try:
        rows, paced = latency(work, settings, target, a.lines, a.interval)
        fast = high_rate(work, settings, target, a.spew)
        big = status_on_big_log(work, a.big)
    finally:
        subprocess.run(["tmux", "-L", _socket(str(root)), "kill-server"], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)

    base = statistics.median(rows[0][1])
    print(f"\n1. follow latency, {a.lines} lines at ~{a.interval * 1000:.0f} ms intervals (write -> printed)")
    print(f"{'follower':38} {'lines':>6} {'median ms':>10} {'p95 ms':>8} {'max ms':>8} {'x tail':>7}  (bar: 50 / 200)")
    for label, lat in rows:
        print(f"{label:38} {len(lat):6d} {statistics.median(lat):10.1f} {pct(lat, 0.95):8.1f} {max(lat):8.1f} "
              f"{statistics.median(lat) / base:7.1f}")

    print("\n2. bytes over the transport per followed line")
    print(f"{'run':34} {'lines':>8} {'log B/line':>11} {'recv B/line':>12} {'sent B/line':>12} "
          f"{'x log':>6} {'reads':>6}")
    for label, d in ((f"high rate ({fast['lines'] / fast['seconds']:.0f} lines/s followed)", fast),
                     (f"paced (~{1 / a.interval:.0f} lines/s, streamed)", paced),
                     (f"paced (~{1 / a.interval:.0f} lines/s, poll 0.1 s)", {**paced, "result": paced["polled"]})):
        r, n = d["result"], max(1, d["lines"])
        print(f"{label:34} {d['lines']:8d} {d['log_bytes'] / n:11.1f} {r.received / n:12.1f} {r.sent / n:12.2f} "
              f"{r.received / max(1, d['log_bytes']):6.2f} {r.reads:6d}")

    print(f"\n3. orch status on a {big['lines']:,}-line log ({big['mb']:.0f} MB), as a subprocess")
    total = sum(big["calls"])
    rate = big["lines"] / ((total - big["without_ms"] * len(big["calls"])) / 1000)
    parse_rate = big["lines"] / big["parse_s"]
    print(f"{'case':44} {'ms':>9} {'x no-metrics':>13}")
    print(f"{'status --no-metrics (baseline)':44} {big['without_ms']:9.0f} {1.0:13.1f}")
    print(f"{'status, first call (reads for up to 2 s)':44} {big['calls'][0]:9.0f} "
          f"{big['calls'][0] / big['without_ms']:13.1f}")
    label = f"status x{len(big['calls'])} until the whole log is read"
    print(f"{label:44} {total:9.0f} "
          f"{total / big['without_ms']:13.1f}")
    print(f"{'status afterwards (nothing new)':44} {big['steady_ms']:9.0f} {big['steady_ms'] / big['without_ms']:13.1f}")
    print(f"ingestion through status: {rate:,.0f} lines/s (agent read + transfer + parse + series + SQLite); "
          f"bare parser on the same lines: {parse_rate:,.0f} lines/s ({rate / parse_rate:.2f}x); "
          f"last step seen {big['step']}")


def _socket(root: str) -> str:
    import hashlib

    return "orch-" + hashlib.sha256(os.path.normpath(root).encode()).hexdigest()[:8]


if __name__ == "__main__":
    main()
