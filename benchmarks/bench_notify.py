"""What notifications cost the run's supervisor, against baselines measured in the same run.

    python benchmarks/bench_notify.py            # 200K log lines, 20 sends
    python benchmarks/bench_notify.py --quick    # 20K lines, 5 sends

1. Reading metric lines for ``spike`` and ``slow`` (``MetricWatch.tick``) against only reading and splitting the
   same log: lines per second and the ratio.
2. ``Notifier.send`` to a dead webhook (a closed port: three tries, 1 s then 2 s apart) as the supervisor sees it
   (it returns once the detached poster is forked) against the post itself done in line (``notify.post``).
Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.agent.watch import notify  # noqa: E402


def _log(folder: str, lines: int) -> str:
    path = os.path.join(folder, "train.log")
    with open(path, "w") as fh:
        for step in range(lines):
            fh.write(f"step={step} loss={2.0 + 0.01 * (step % 7):.4f} tok/s={10000 + step % 13} epoch=0\n")
    return path


def _split_only(path: str) -> int:
    count, rest = 0, b""
    with open(path, "rb") as fh:
        while data := fh.read(1 << 20):
            *done, rest = (rest + data).split(b"\n")
            count += sum(1 for raw in done if raw.decode("utf-8", "replace"))
    return count


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/hook"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    lines, sends = (20_000, 5) if args.quick else (200_000, 20)
    with tempfile.TemporaryDirectory() as folder:
        path = _log(folder, lines)
        t0 = time.perf_counter()
        _split_only(path)
        base = time.perf_counter() - t0
        told = notify.Notifier(folder, {"format": "json", "on": ["spike", "slow"],
                                        "context": {"baseline": {"experiment": 1, "tok_s": 10000.0}}}, _dead_url())
        told.send = lambda *a, **k: None  # type: ignore[method-assign]  (the reading alone)
        watch = notify.MetricWatch(told, path)
        watch.offset = 0
        t0 = time.perf_counter()
        while True:
            before = watch.offset
            watch.tick()
            if watch.offset == before:
                break
        parsed = time.perf_counter() - t0

        url = _dead_url()
        real = notify.Notifier(folder, {"format": "json", "on": ["crashed"], "context": {}}, url)
        forks = []
        for _ in range(sends):
            t0 = time.perf_counter()
            real.send("crashed", exit_code=1, last_lines=["x"] * 10)
            forks.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        notify.post(url, b"{}", {})
        inline = time.perf_counter() - t0
    rows = [("metric lines: read + split only", f"{lines / base:,.0f} lines/s", "1.00x"),
            ("metric lines: MetricWatch.tick", f"{lines / parsed:,.0f} lines/s", f"{parsed / base:.2f}x"),
            ("dead webhook: post in line", f"{inline * 1000:,.0f} ms", "1.00x"),
            ("dead webhook: Notifier.send (median)", f"{statistics.median(forks) * 1000:.2f} ms",
             f"{statistics.median(forks) / inline:.4f}x")]
    width = max(len(r[0]) for r in rows)
    print(f"{'what':<{width}}  {'figure':>16}  {'vs baseline':>11}")
    for name, figure, ratio in rows:
        print(f"{name:<{width}}  {figure:>16}  {ratio:>11}")


if __name__ == "__main__":
    main()
