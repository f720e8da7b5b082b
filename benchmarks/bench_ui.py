"""`orch ui`: its first page with a long history, how soon a metric the run prints is on screen, and its idle cost.

One project on the built-in local target, with --rows finished experiments in its registry (each with a metric
summary, as status leaves them) and a run deployed there that prints `step=N loss=X at=T` every --every s. In
the same run, each against the CLI doing the same:
  - the first page: the page, its script and the table's data over HTTP (medians of --runs), and, where Debian's
    chromium and Playwright are installed, the page's own clock from the navigation to the frame after the
    table's first page of rows is in it (the server filters, sorts and pages: 100 rows however long the
    history), the registry as it was and just after a command wrote it; against
    `orch experiments list --json --limit ROWS` (a fresh process: what a script that wanted the same rows pays);
  - a new metric point: from the `at=` the run printed to the point in the page's loss chart (the browser's
    `data-points` growing; without a browser, to the event on the stream), against `orch logs --follow` printing
    the same line;
  - idle: the server's CPU over --idle s with no page open (after one was open and closed), against a sleeping
    Python process.
Prints one table; asserts nothing about time.
Run: python benchmarks/bench_ui.py [--rows 1000] [--runs 7] [--idle 10]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from orchestrator.records.experiments import Registry  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TICKER = ("import sys, time\nevery = float(sys.argv[1])\nfor i in range(1, 100000):\n"
          "    print(f'step={i} loss={10 / i:.5f} at={time.time():.6f}', flush=True)\n    time.sleep(every)\n")
ENV = {**os.environ, "ORCH_WARM": "0"}


def orch(work: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], cwd=work, capture_output=True,
                          text=True, env=ENV, **kw)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fill(db: Path, rows: int) -> None:
    """``rows`` finished experiments like the first one, each with the summary status would have stored."""
    with Registry(db) as reg:
        first = reg.get(1)
        with reg.batch():
            for i in range(rows):
                exp = reg.create(project=first.project, target=first.target, target_info=first.target_info,
                                 machine=first.machine, revision=first.revision, command=first.command,
                                 config=first.config, batching={"strategy": ("megabatch", "shuffle", "sorted")[i % 3]},
                                 status="finished", exit_code=0, started=first.created - 3600,
                                 ended=first.created - 3000, message=f"run {i} of an old sweep", sweep=f"s{i // 50}")
                reg.save_metrics(exp.id, 1000, {}, {"loss": 2.0 + i / rows, "median_tok_s": 15000.0 + i,
                                                    "_state": {"complete": True}})


def http_first_page(base: str, token: str, runs: int) -> float:
    def once() -> float:
        t = time.perf_counter()
        for path in ("/", "/static/app.js", "/api/table"):
            req = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {token}"})
            with urllib.request.urlopen(req) as r:
                r.read()
        return (time.perf_counter() - t) * 1000
    once()
    return statistics.median(once() for _ in range(runs))


def cli_list_ms(work: Path, rows: int, runs: int) -> float:
    def once() -> float:
        t = time.perf_counter()
        orch(work, "experiments", "list", "--json", "--limit", str(rows + 1), check=True)
        return (time.perf_counter() - t) * 1000
    return statistics.median(once() for _ in range(runs))


def printed_at(line: str) -> float | None:
    m = re.search(r"\bat=([0-9.]+)", line)
    return float(m.group(1)) if m else None


def follow_latency(work: Path, lines: int) -> list[float]:
    """`orch logs --follow`: seconds from each line's `at=` to its arrival on the follower's stdout."""
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "logs", "--follow", "-n", "0"],
                            cwd=work, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ENV)
    out = []
    try:
        assert proc.stdout is not None
        while len(out) < lines:
            line = proc.stdout.readline()
            at = printed_at(line)
            if at is not None:
                out.append(time.time() - at)
    finally:
        proc.terminate()
        proc.wait()
    return out[2:]  # the first ones may have been written while it connected


def stream_latency(base: str, token: str, exp_id: int, lines: int) -> list[float]:
    """The event stream alone: seconds from each line's `at=` to its event."""
    req = urllib.request.Request(f"{base}/api/experiments/{exp_id}/events",
                                 headers={"Authorization": f"Bearer {token}"})
    out: list[float] = []
    opened = time.time() + 1.0  # what the run printed before is the log's replay, not a new point
    with urllib.request.urlopen(req) as r:
        while len(out) < lines:
            raw = r.readline().decode()
            if not raw.startswith("data: "):
                continue
            event = json.loads(raw[6:])
            if event["type"] == "data":
                now = time.time()
                out += [now - at for at in map(printed_at, event["log"]) if at is not None and at > opened]
    return out[2:]


def browser(url: str, exp_id: int, runs: int, lines: int, change) -> tuple[float, float, list] | None:
    """(median ms from the navigation to the painted table: the registry as it was, and just changed by a command;
    each (time, points) the loss chart showed)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if not Path(CHROMIUM).exists():
        return None
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = b.new_context().new_page()
        page.goto(url)  # the token becomes the cookie
        page.wait_for_selector("#view[data-ready='1'] tr[data-experiment-id]")
        base = url.split("?")[0]
        # the page's own clock, from the navigation's start to the frame after the table's rows are in the page
        # (the test driver's polling, slow on a busy machine, is not the page's time)
        page.add_init_script("""new MutationObserver(() => { const v = document.getElementById("view");
            if (v && v.dataset.ready === "1" && v.querySelector("tr[data-experiment-id]") && !window.rowsAt) {
              window.rowsAt = performance.now(); requestAnimationFrame(() => { window.paintedAt = performance.now(); });
            } }).observe(document, { subtree: true, childList: true, attributes: true });""")
        times, changed = [], []
        for i in range(2 * runs):
            page.goto("about:blank")
            if i % 2:
                change(i)  # a command wrote the registry: the table is read anew
            page.goto(base)
            (changed if i % 2 else times).append(page.wait_for_function("window.paintedAt").json_value())
        page.goto(f"{base}#/exp/{exp_id}")
        page.wait_for_selector(".chart[data-series='loss']")
        page.wait_for_function("Number(document.querySelector(\".chart[data-series='loss']\").dataset.points) > 0")
        # each time the loss chart's point count changes, the wall clock (the run's clock: the same machine)
        page.evaluate("""() => { window.seen = []; const el = document.querySelector(".chart[data-series='loss']");
            new MutationObserver(() => window.seen.push([Date.now() / 1000, Number(el.dataset.points)]))
              .observe(el, { attributes: true, attributeFilter: ["data-points"] }); }""")
        start = int(page.get_attribute(".chart[data-series='loss']", "data-points"))
        page.wait_for_function(f"window.seen.length && window.seen[window.seen.length - 1][1] >= {start + lines}",
                               timeout=120000)
        seen = page.evaluate("window.seen")
        b.close()
    return statistics.median(times), statistics.median(changed), seen


def chart_latency(work: Path, root: Path, exp_id: int, seen: list, registry_id: str) -> list[float]:
    """Seconds from each loss line's `at=` to the chart holding its point (step N is the chart's N-th point)."""
    text = (root / "runs" / f"{registry_id}-{exp_id}" / "train.log").read_text()
    printed = {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"step=(\d+) loss=\S+ at=([0-9.]+)", text)}
    out = []
    first = seen[0][1] if seen else 0
    for step in range(first + 1, seen[-1][1] + 1):
        shown = next(t for t, n in seen if n >= step)
        if step in printed:
            out.append(shown - printed[step])
    return out


def idle_cpu(pid: int, seconds: float) -> float:
    before, t = cpu_s(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_s(pid) - before) / (time.monotonic() - t) * 100


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--every", type=float, default=0.25, help="seconds between the run's metric lines")
    ap.add_argument("--lines", type=int, default=24, help="metric lines timed per reader")
    ap.add_argument("--idle", type=float, default=10.0)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="orch-bench-ui-"))
    root = work / "target"
    (work / "ticker.py").write_text(TICKER)
    (work / "orch.toml").write_text(
        f'[project]\nname = "ui"\nsources = ["ticker.py"]\ncommand = "python3 ticker.py {a.every}"\n'
        f'[run]\nstop_timeout = 2\n[targets.local]\nkind = "local"\nroot = "{root}"\n'
        f'checkpoints = "{root}/checkpoints"\n')
    db = work / ".orch" / "experiments.db"
    server = None
    try:
        orch(work, "deploy", "-m", "first", check=True)
        orch(work, "stop", check=True)
        fill(db, a.rows)
        res = orch(work, "deploy", "-m", "the live one", "--json", check=True)
        live = json.loads(res.stdout)["experiment"]["id"]
        with Registry(db) as reg:
            registry_id = reg.registry_id
        server = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "ui"], cwd=work,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ENV)
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        base, token = url.split("/?token=")[0], url.split("token=")[1]
        http_ms = http_first_page(base, token, a.runs)
        cli_ms = cli_list_ms(work, a.rows, a.runs)
        follow = follow_latency(work, a.lines)
        stream = stream_latency(base, token, live, a.lines)
        def change(i: int) -> None:
            with Registry(db) as reg:
                reg.update(1, message=f"first, renamed {i}")

        seen = browser(url, live, a.runs, a.lines, change)
        chart = chart_latency(work, root, live, seen[2], registry_id) if seen else None
        time.sleep(6)  # the page is closed: its follower is cancelled once nobody watched it for 5 s
        ui_idle = idle_cpu(server.pid, a.idle)
        sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        time.sleep(0.5)
        sleep_idle = idle_cpu(sleeper.pid, a.idle)
        sleeper.kill()
        sleeper.wait()
    finally:
        if server is not None:
            server.terminate()
            server.wait()
        orch(work, "stop")
        subprocess.run(["tmux", "-L", f"orch-{hashlib.sha256(str(root).encode()).hexdigest()[:8]}", "kill-server"],
                       capture_output=True)
    rows = a.rows + 2
    print(f"\norch ui on the local target, {rows} experiments in the registry; medians of {a.runs} (latency: of "
          f"{a.lines - 2} lines printed every {a.every:g} s)")
    print("| what | orch ui | the CLI | ratio |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| first page over HTTP (page, script, table data) vs `orch experiments list --json` | {http_ms:.0f} ms | "
          f"{cli_ms:.0f} ms | {http_ms / cli_ms:.2f}x |")
    if seen:
        print(f"| first page in chromium, navigation to the table's first frame vs the same CLI | {seen[0]:.0f} ms | "
              f"{cli_ms:.0f} ms | {seen[0] / cli_ms:.2f}x |")
        print(f"| the same, just after a command wrote the registry (the table read anew) | {seen[1]:.0f} ms | "
              f"{cli_ms:.0f} ms | {seen[1] / cli_ms:.2f}x |")
    fm = statistics.median(follow)
    print(f"| a metric line: printed to the event stream vs to `orch logs --follow` (median; p90) | "
          f"{statistics.median(stream) * 1000:.0f} ms; {pct(stream, 0.9) * 1000:.0f} ms | {fm * 1000:.0f} ms; "
          f"{pct(follow, 0.9) * 1000:.0f} ms | {statistics.median(stream) / fm:.2f}x |")
    if chart:
        print(f"| a metric line: printed to the point in the page's chart vs `orch logs --follow` (median; max) | "
              f"{statistics.median(chart) * 1000:.0f} ms; {max(chart) * 1000:.0f} ms | {fm * 1000:.0f} ms; "
              f"{max(follow) * 1000:.0f} ms | {statistics.median(chart) / fm:.2f}x |")
    print(f"| idle CPU over {a.idle:g} s, no page open, vs a sleeping python | {ui_idle:.2f} % | {sleep_idle:.2f} % | - |")


if __name__ == "__main__":
    main()
