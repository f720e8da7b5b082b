"""What bench_speed.py's cases share: pairs timed in turn, medians, peak memory of process trees, the one table.

    orch_s, base_s = pairs(orch_once, base_once, runs)   # each a function of the run index returning seconds
    print_table([Case("cold deploy", orch_s, base_s, ratio_bar=0.8)])
"""

from __future__ import annotations

import os
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent

from tests.testbed.procs import peak_kb



def wheel_install(work: Path, python: str, source: Path = REPO) -> Path:
    """orch as users install it, its bin/ folder: a wheel built from a copy of ``source``'s shipped files and
    installed (its bytecode compiled, as pip does) into a venv of its own. Its dependencies are the ones ``python``'s
    environment has, named by a .pth file: a .pth found in a folder that a .pth added is not read, so the checkout's
    editable install (its path or import hook) stays out."""
    from tests.packaging.wheel_build import build_wheel

    wheel, venv = build_wheel(source, work / "wheel", python), work / "installed"
    check([python, "-m", "venv", "--without-pip", str(venv)])
    check([python, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps", str(wheel)])
    where = ["-c", "import site; print(site.getsitepackages()[0])"]
    deps, ours = (check([py, *where]).stdout.strip() for py in (python, str(venv / "bin" / "python")))
    (Path(ours) / "orch-bench-deps.pth").write_text(deps + "\n")
    return venv / "bin"


def wall(fn: Callable[[int], object]) -> Callable[[int], float]:
    """``fn`` made to return its own wall time in seconds."""
    def timed(i: int) -> float:
        begin = time.perf_counter()
        fn(i)
        return time.perf_counter() - begin
    return timed


def pairs(orch: Callable[[int], float], base: Callable[[int], float], runs: int) -> tuple[float, float]:
    """Medians of ``runs`` pairs, orch and its baseline one after the other, the order swapped every pair (so
    neither always runs right after the other's work), each begun on a quiet machine (``quiet``)."""
    mine, theirs = [], []
    for i in range(runs):
        for fn, into in ((orch, mine), (base, theirs))[::1 if i % 2 else -1]:
            quiet()
            into.append(fn(i))
    return statistics.median(mine), statistics.median(theirs)


def quiet(share: float = 0.05, window: float = 0.2, limit: float = 5.0) -> bool:
    """Wait (at most ``limit`` s) for a ``window`` in which this machine's CPUs were busy less than ``share`` of
    the time: what the last sample left behind (a stopped run's exit, a standby supervisor's start, the page cache
    written back) has settled before the next one is timed. False when it never did."""
    deadline = time.monotonic() + limit
    cpus = os.cpu_count() or 1
    while time.monotonic() < deadline:
        before = busy_ms()
        time.sleep(window)
        if busy_ms() - before < share * window * 1000 * cpus:
            return True
    return False


def check(argv: list[str], **kw) -> subprocess.CompletedProcess:
    """Run ``argv``; stop the benchmark with its stderr when it fails."""
    out = subprocess.run(argv, capture_output=True, text=True, **kw)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({out.returncode}): {out.stdout[-2000:]}{out.stderr[-2000:]}")
    return out


def _parents() -> dict[int, int]:
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            found[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    return found


def tree(roots: set[int]) -> set[int]:
    """``roots`` and every process below them."""
    parents, found = _parents(), set(roots)
    grew = True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in found and pid not in found:
                found.add(pid)
                grew = True
    return found


def cpu_ms(pids: set[int]) -> float:
    """CPU time the processes ``pids`` have used (user and system, their reaped children's too), in ms."""
    ticks = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    return ticks * 1000 / os.sysconf("SC_CLK_TCK")


def busy_ms() -> float:
    """CPU time this machine has spent busy (every CPU, every process), in ms."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = \
        (int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9])
    return (user + nice + system + irq + softirq + steal) * 1000 / os.sysconf("SC_CLK_TCK")


class PeakWatch:
    """Samples, every 20 ms until ``stop``, the largest VmHWM of any process ``pids()`` names."""

    def __init__(self, pids: Callable[[], set[int]]) -> None:
        self.pids, self.peak = pids, 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._done.is_set():
            self.peak = max([self.peak, *(peak_kb(pid) for pid in self.pids())])
            self._done.wait(0.02)

    def __enter__(self) -> "PeakWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


@dataclass
class Case:
    name: str
    orch_s: float
    base_s: float
    baseline: str  # what the baseline is, in words
    ratio_bar: float | None  # None: only the bar on orch's own time
    ms_bar: float | None = None  # a bar on orch's own time, too
    rss_mib: tuple[int, int] | None = None  # peak RSS, controller side and target side
    rss_bar: int | None = None
    notes: tuple[str, ...] = ()  # what else was measured, printed under the table

    @property
    def ratio(self) -> float:
        return self.orch_s / self.base_s

    @property
    def met(self) -> bool:
        ok = self.ratio_bar is None or self.ratio <= self.ratio_bar
        if self.ms_bar is not None:
            ok = ok and self.orch_s * 1000 <= self.ms_bar
        if self.rss_bar is not None and self.rss_mib is not None:
            ok = ok and max(self.rss_mib) <= self.rss_bar
        return ok

    def bar(self) -> str:
        parts = [] if self.ratio_bar is None else [f"<= {self.ratio_bar:g}x"]
        if self.ms_bar is not None:
            parts.append(f"<= {self.ms_bar:g} ms")
        if self.rss_bar is not None:
            parts.append(f"<= {self.rss_bar} MB")
        return ", ".join(parts)


def _time(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def print_table(cases: list[Case], title: str) -> None:
    print(f"\n{title}")
    print(f"| case | orch | baseline | ratio | bar | met | peak RSS orch / target |")
    print("| --- | ---: | ---: | ---: | --- | --- | --- |")
    for c in cases:
        rss = f"{c.rss_mib[0]} / {c.rss_mib[1]} MiB" if c.rss_mib else ""
        print(f"| {c.name} | {_time(c.orch_s)} | {_time(c.base_s)} ({c.baseline}) | {c.ratio:.2f}x | {c.bar()} | "
              f"{'met' if c.met else 'not met'} | {rss} |")
    for c in cases:
        for note in c.notes:
            print(f"{c.name}: {note}")
