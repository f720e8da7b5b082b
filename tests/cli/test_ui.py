"""``orch ui`` on the local target, in a real browser (Playwright driving Debian's chromium), against real runs.

The server is the real ``orch ui`` as a subprocess; the runs are real tinylm runs in tmux; what the page shows is
checked against the CLI's own ``--json`` answers. Screenshots go to ``$ORCH_UI_SCREENSHOTS`` when it is set.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.cli.test_lifecycle import wait_status
from tests.cli.test_secrets import configure as configure_secrets
from tests.conftest import wait_for



class Server:
    """``orch ui`` running in the project folder; ``url`` is the one it printed."""

    def __init__(self, project) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "ui", "--port", "0"],
                                     cwd=project.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        match = re.fullmatch(r"http://127\.0\.0\.1:(\d+)/\?token=([\w-]+)", self.url)
        assert match, (self.url, self.proc.stderr.read() if self.proc.poll() is not None else "")
        self.port, self.token = int(match.group(1)), match.group(2)
        self.base = f"http://127.0.0.1:{self.port}"

    def request(self, path: str, method: str = "GET", headers: dict | None = None) -> tuple[int, dict | str]:
        req = urllib.request.Request(self.base + path, method=method, headers=headers or {},
                                     data=b"{}" if method == "POST" else None)
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                status, body = r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            status, body = exc.code, exc.read().decode()
        try:
            return status, json.loads(body)
        except json.JSONDecodeError:
            return status, body

    def bearer(self) -> dict:
        return {"Authorization": f"Bearer {self.token}"}

    def close(self) -> int:
        self.proc.send_signal(signal.SIGINT)  # Ctrl-C ends it
        code = self.proc.wait(timeout=30)
        self.proc.stdout.close()
        self.proc.stderr.close()
        return code


@pytest.fixture
def server(project):
    srv = Server(project)
    yield srv
    if srv.proc.poll() is None:
        assert srv.close() == 0




def shot(page, name: str) -> None:
    folder = os.environ.get("ORCH_UI_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=True)


def listening_address(port: int) -> str:
    """The address the server's socket listens on, read from the kernel's table."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, status = fields[1], fields[3]
        addr, hexport = local.split(":")
        if int(hexport, 16) == port and status == "0A":  # LISTEN
            return ".".join(str(int(addr[i:i + 2], 16)) for i in (6, 4, 2, 0))
    raise AssertionError(f"nothing listens on port {port}")


def test_it_listens_on_loopback_only_and_every_request_needs_the_token(project, server):
    assert listening_address(server.port) == "127.0.0.1"
    assert server.request("/api/table")[0] == 403  # no token
    assert server.request("/")[0] == 403
    assert server.request("/api/table", headers={"Authorization": "Bearer not-the-token"})[0] == 403
    wrong = server.token[:-1] + ("x" if server.token[-1] != "x" else "y")  # one character off, never the token
    assert server.request(f"/api/table?token={wrong}")[0] == 403
    status, body = server.request("/api/table", headers=server.bearer())
    assert status == 200 and body["rows"] == []  # nothing recorded yet: an empty table, no registry made
    assert not (project.path / ".orch" / "experiments.db").exists()
    # the link's token becomes a cookie for this port, and the address bar loses it
    opener = urllib.request.build_opener(type("NoRedirect", (urllib.request.HTTPRedirectHandler,),
                                              {"redirect_request": lambda *a, **k: None}))
    with pytest.raises(urllib.error.HTTPError) as moved:
        opener.open(server.url, timeout=10)
    assert moved.value.code == 303 and moved.value.headers["Location"] == "/"
    cookie = moved.value.headers["Set-Cookie"]
    assert cookie.startswith(f"orch-ui-{server.port}={server.token};") and "HttpOnly" in cookie
    assert "SameSite=Strict" in cookie
    # a name that resolves to 127.0.0.1 but is not the server's (DNS rebinding) is refused, token or not
    assert server.request("/api/table", headers={**server.bearer(), "Host": f"evil.example:{server.port}"})[0] == 403
    assert server.close() == 0


class Forger(ThreadingHTTPServer):
    """Another origin on this machine (another port of 127.0.0.1: the same site, so the browser sends the
    dashboard's cookie along) whose page posts a stop to the dashboard."""

    def __init__(self, target: str) -> None:
        page = (f"<script>fetch('{target}', {{method: 'POST', credentials: 'include', mode: 'no-cors', "
                "body: 'x'}).then(() => document.title = 'sent', () => document.title = 'failed');</script>")

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = page.encode()
                self.send_response(200)
                self.send_header("content-type", "text/html")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/"


def loss_lines(project, exp_id: int) -> int:
    log = project.run_dir(exp_id) / "train.log"
    return log.read_text().count("loss=") if log.exists() else 0


def test_a_live_run_from_the_table_to_its_growing_chart_a_refused_forgery_and_a_confirmed_stop(project, server,
                                                                                              page):
    project.configure(steps=20)
    assert project.cli("deploy", "-m", "baseline", "--wait").exit_code == 0
    wait_status(project, 1, ("finished",))
    project.configure(steps=100000, ckpt_every=1000, sleep=0.05)
    (project.path / "orch.toml").write_text((project.path / "orch.toml").read_text().replace(
        'TINYLM_SAMPLES = "600"', 'TINYLM_SAMPLES = "600", TINYLM_LOG_EVERY = "2"'))
    res = project.cli("deploy", "-m", "long run", "--wait")
    assert res.exit_code == 0, res.output

    # the table: one row per experiment, as orch experiments list --json has them
    page.goto(server.url)
    page.wait_for_selector("#view[data-ready='1'] tr[data-experiment-id]")
    listed = json.loads(project.cli("experiments", "list", "--json").stdout)
    rows = page.eval_on_selector_all("tr[data-experiment-id]", "rs => rs.map(r => [Number(r.dataset.experimentId), "
                                     "r.dataset.state, r.querySelector('td.msg').textContent])")
    assert rows == [[e["id"], e["status"], e["message"]] for e in listed]
    assert [r[0] for r in rows] == [2, 1]
    page.fill("[data-filter='message']", "long")  # filtered by the server, a moment after the typing stops
    wait_for(lambda: page.eval_on_selector_all("tr[data-experiment-id]", "rs => rs.map(r => r.dataset.experimentId)")
             == ["2"], what="the filtered table")
    shot(page, "1-table")

    # the run's page: its loss chart grows as the run prints, with no reload
    page.click("tr[data-experiment-id='2']")
    chart = page.locator(".chart[data-series='loss']")
    chart.wait_for()
    page.evaluate("window.stillThisPage = true")
    first = wait_for(lambda: int(chart.get_attribute("data-points")), what="the first loss points")
    wait_for(lambda: int(chart.get_attribute("data-points")) >= first + 3, timeout=30, what="the chart to grow")
    assert page.evaluate("window.stillThisPage") is True
    assert page.locator(".chart[data-series='tok_s']").count() == 1
    wait_for(lambda: "loss=" in page.inner_text("#log"), what="the log to follow")
    shot(page, "2-experiment-live")

    # forged stops, while the run trains on: no token; the token but another origin; another origin's page
    before = loss_lines(project, 2)
    assert server.request("/api/experiments/2/stop", "POST")[0] == 403
    assert server.request("/api/experiments/2/stop", "POST",
                          {**server.bearer(), "Origin": "http://evil.example"})[0] == 403
    assert server.request("/api/experiments/2/stop", "POST",
                          {**server.bearer(), "Sec-Fetch-Site": "cross-site"})[0] == 403
    forger = Forger(f"{server.base}/api/experiments/2/stop")
    try:
        evil = page.context.new_page()
        evil.goto(forger.url)
        wait_for(lambda: evil.title() in ("sent", "failed"), what="the forged request")
        evil.close()
    finally:
        forger.shutdown()
        forger.server_close()
    wait_for(lambda: loss_lines(project, 2) >= before + 5, timeout=30, what="the run to train on")
    assert json.loads(project.cli("status", "--json").stdout)["state"] == "running"

    # stop asks first (the browser's confirm): Cancel leaves the run alone; confirmed, the run stops
    stop = page.locator("[data-action='stop']")
    asked: list[str] = []
    page.once("dialog", lambda d: (asked.append(d.message), d.dismiss()))
    stop.click()
    wait_for(lambda: asked, what="the confirmation")
    assert asked[0].startswith("Stop experiment 2?") and "SIGINT" in asked[0]
    again = loss_lines(project, 2)
    wait_for(lambda: loss_lines(project, 2) > again + 2, timeout=30, what="the run to go on after Cancel")
    assert json.loads(project.cli("experiments", "show", "2", "--json").stdout)["status"] == "running"
    page.once("dialog", lambda d: (asked.append(d.message), d.accept()))
    stop.click()
    wait_status(project, 2, ("stopped",))
    assert len(asked) == 2
    wait_for(lambda: page.locator("h2 .state.stopped").count() == 1, timeout=30, what="the page to say stopped")
    shot(page, "4-stopped")
    assert page.evaluate("window.stillThisPage") is True


def test_compare_overlays_the_curves_beside_the_batching_difference(project, server, page):
    project.configure(steps=30, ckpt_every=10)
    assert project.cli("deploy", "-m", "megabatch", "--wait").exit_code == 0
    wait_status(project, 1, ("finished",))
    assert project.cli("deploy", "-m", "shuffled", "--set", "batching.strategy=shuffle", "--clean-checkpoints",
                       "--yes", "--wait").exit_code == 0  # from step 0, not from the first run's last checkpoint
    wait_status(project, 2, ("finished",))
    page.goto(server.url)
    page.wait_for_selector("#view[data-ready='1'] tr[data-experiment-id]")
    for exp_id in (1, 2):
        page.check(f"tr[data-experiment-id='{exp_id}'] input[type=checkbox]")
    page.click("text=Compare selected")
    page.wait_for_selector("#view[data-ready='1'] #diff")
    cli = json.loads(project.cli("experiments", "compare", "1", "2", "--json").stdout)
    keys = page.eval_on_selector_all("#diff tr[data-key]", "rs => rs.map(r => r.dataset.key)")
    assert keys[0] == "batching.strategy" and set(keys) == {r["key"] for r in cli["diff"]}
    assert page.inner_text("#diff tr[data-key='batching.strategy']").split() == \
        ["batching.strategy", "megabatch", "shuffle"]
    points = int(page.get_attribute(".chart[data-series='loss']", "data-points"))
    stored = sum(len(_loss_points(project, i)) for i in (1, 2))
    assert points == stored and points > 0
    assert page.locator(".chart[data-series='loss'] .u-legend .u-series").count() == 3  # step + two curves
    shot(page, "5-compare")
    page.select_option("[data-control='xaxis']", "time")  # the same points, each run's steps over its start to end
    wait_for(lambda: page.get_attribute(".chart[data-series='loss']", "data-x") == "time", what="the time axis")
    assert "minutes since start" in page.inner_text(".chart[data-series='loss']")
    wait_for(lambda: page.get_attribute(".chart[data-series='loss']", "data-points") == str(stored),
             what="every point by time")
    shot(page, "6-compare-by-time")


def _loss_points(project, exp_id: int) -> list:
    from orchestrator.watch.metrics import Series

    with project.registry() as reg:
        return Series.from_dict(reg.metrics(exp_id)["series"]["loss"]).points()


def test_no_secret_or_webhook_url_reaches_a_page_or_an_answer(project, server):
    configure_secrets(project)
    hook = "http://127.0.0.1:9/hook-c0ffee-never-shown"
    with (project.path / "orch.toml").open("a") as f:
        f.write(f'\n[notify]\nurl = "{hook}"\n')
    secret = "wandb-" + os.urandom(8).hex()
    res = project.run("deploy", "-m", "with secrets", env={"WANDB_API_KEY": secret, "HF_TOKEN": "hf-" + secret})
    assert res.returncode == 0, res.stderr
    seen = []
    for path in ("/", "/static/app.js", "/api/table", "/api/experiments", "/api/experiments/1",
                 "/api/experiments/1/status", "/api/experiments/1/checkpoints", "/api/queue", "/api/gpu-use"):
        status, body = server.request(path, headers=server.bearer())
        assert status == 200, (path, body)
        seen.append(json.dumps(body) if not isinstance(body, str) else body)
    status, body = server.request("/api/experiments/1", headers=server.bearer())
    assert body["secrets"] == ["WANDB_API_KEY", "HF_TOKEN"]  # their names, as orch experiments show --json has
    text = "\n".join(seen)
    assert secret not in text and "hook-c0ffee" not in text
    assert project.cli("stop").exit_code == 0


def test_a_closed_page_stops_following_its_run_and_the_run_goes_on(project, monkeypatch):
    from orchestrator.config import load_settings
    from orchestrator.ui import live

    monkeypatch.setattr(live, "LINGER_S", 0.5)
    project.configure(steps=100000, ckpt_every=1000, sleep=0.05)
    assert project.cli("deploy", "-m", "watched", "--wait").exit_code == 0
    hub = live.Hub(load_settings(project.path / "orch.toml"))
    got: list[dict] = []
    handle = hub.watch(1, got.append)
    assert got[0]["type"] == "snapshot"
    wait_for(lambda: sum(len(e["points"].get("loss", [])) for e in got if e["type"] == "data") >= 3,
             what="live loss points")
    printed = [float(v) for v in re.findall(r"loss=([0-9.]+)", (project.run_dir(1) / "train.log").read_text())]
    seen = [p[1] for e in got if e["type"] == "data" for p in e["points"].get("loss", [])]
    assert seen == printed[:len(seen)]  # every point the log printed, in order, none twice
    follower = hub.followers[1]
    hub.unwatch(1, handle)
    follower.thread.join(timeout=15)  # cancelled after LINGER_S, at the stream's next frame or heartbeat
    assert not follower.thread.is_alive() and 1 not in hub.followers
    assert json.loads(project.cli("status", "--json").stdout)["state"] == "running"
    assert project.cli("stop").exit_code == 0


def test_restart_asks_with_what_will_move_and_moves_the_checkpoints_to_the_trash(project, server, page):
    project.configure(steps=30, ckpt_every=10)
    assert project.cli("deploy", "-m", "first", "--wait").exit_code == 0
    wait_status(project, 1, ("finished",))
    kept = sorted(p.name for p in project.checkpoints.iterdir())
    assert kept
    page.goto(server.url)
    page.wait_for_selector("#view[data-ready='1'] tr[data-experiment-id]")
    page.click("tr[data-experiment-id='1']")
    page.wait_for_selector("h2:has-text('(finished, exit 0)')")  # its whole log read: the follower ended
    printed = (project.run_dir(1) / "train.log").read_text().count(" loss=")
    assert page.get_attribute(".chart[data-series='loss']", "data-points") == str(printed) != "0"  # once each
    page.wait_for_selector("#checkpoints tbody tr", timeout=60000)  # in name order, sizes as people read them
    assert page.locator("#checkpoints tbody td:first-child").all_inner_texts() == kept
    sizes = page.locator("#checkpoints tbody td.num").all_inner_texts()
    assert sizes and all(re.fullmatch(r"\d+(\.\d+)? (B|KiB|MiB)", size) for size in sizes), sizes
    asked: list[str] = []
    page.once("dialog", lambda d: (asked.append(d.message), d.accept()))
    page.click("[data-action='restart']")  # the dry run's plan is asked first, then the confirmation
    page.wait_for_function("location.hash === '#/exp/2'", timeout=120000)
    assert asked[0].startswith("Restart experiment 1?")
    moves = asked[0].split("Moves ", 1)[1]
    assert all(name in moves for name in kept) and str(project.checkpoints) in moves and "trash" in moves
    trashed = sorted(p.name for p in (project.checkpoints.parent / "checkpoints.trash").rglob("ckpt-*"))
    assert trashed == kept  # moved, never deleted
    entry = page.locator("#trash tbody tr").first  # the new experiment's page: the trash entry, its size and date
    entry.wait_for(timeout=60000)
    cells = entry.locator("td").all_inner_texts()
    assert cells[3:5] == ["exp1", "exp 2"] and re.fullmatch(r"\d+(\.\d+)? (B|KiB|MiB)", cells[2]), cells
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d", cells[5]), cells
    show = json.loads(project.cli("experiments", "show", "2", "--json").stdout)
    assert show["parent"] == 1 and show["checkpoints_action"] == "moved"
    assert project.cli("stop").exit_code == 0


def test_a_queued_experiment_is_removed_from_the_queue_once_confirmed(project, server, page):
    project.configure(steps=100000, ckpt_every=1000, sleep=0.05)
    assert project.cli("deploy", "-m", "running", "--wait").exit_code == 0
    res = project.cli("deploy", "-m", "next", "--queue")
    assert res.exit_code == 0, res.output
    page.goto(server.url)
    page.goto(server.base + "/#/queue")
    row = page.locator("#view[data-ready='1'] tr[data-experiment-id='2']")
    row.wait_for()
    page.once("dialog", lambda d: d.accept())
    row.locator("[data-action='queue-remove']").click()
    wait_for(lambda: json.loads(project.cli("experiments", "show", "2", "--json").stdout)["status"] == "stopped",
             timeout=60, what="experiment 2 out of the queue")
    assert json.loads(project.cli("queue", "--json").stdout)["queue"] == []
    wait_for(lambda: page.locator("tr[data-experiment-id='2']").count() == 0, what="the queue page to drop it")
    assert json.loads(project.cli("status", "--json").stdout)["state"] == "running"  # the running one goes on
    assert project.cli("stop").exit_code == 0


def test_a_taken_port_is_refused_with_what_to_do(project):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = project.run("ui", "--port", str(port), timeout=60)
    assert res.returncode != 0 and res.stdout == ""
    assert f"error: cannot listen on 127.0.0.1:{port}" in res.stderr and "hint: choose another --port" in res.stderr


def test_without_the_web_server_it_says_to_install_the_extra_from_orchs_checkout(project, tmp_path):
    shadow = tmp_path / "no-uvicorn" / "uvicorn"  # a uvicorn that cannot be imported, as when the extra is missing
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'uvicorn'\", name='uvicorn')\n")
    res = project.run("ui", timeout=60, env={"PYTHONPATH": str(shadow.parent)})
    assert res.returncode == 2 and res.stdout == ""
    assert "error: orch ui needs starlette and uvicorn, which are not installed" in res.stderr
    assert "hint: install orch's ui extra from its checkout or wheel: pip install '<orch checkout>[ui]'" in res.stderr


PIPX = "orch runs from pipx's environment 'orch': add the extra with pipx install --force '<orch checkout>[ui]'"
UV = "orch runs from uv's tool environment 'orch': add the extra with uv tool install --force '<orch checkout>[ui]'"


@pytest.mark.parametrize("home, mark, says", [
    ("pipx/venvs/orch", None, PIPX), ("elsewhere/orch", "pipx_metadata.json", PIPX),  # PIPX_HOME set
    ("share/uv/tools/orch", None, UV), ("elsewhere/orch", "uv-receipt.toml", UV)])  # UV_TOOL_DIR set
def test_from_a_pipx_or_uv_tool_environment_the_hint_names_that_tool(project, tmp_path, home, mark, says):
    import site
    import venv

    env = tmp_path / ".local" / home  # where pipx and uv keep a tool's environment, or elsewhere with their mark
    venv.EnvBuilder(with_pip=False).create(env)
    if mark:
        (env / mark).write_text("{}\n")
    shadow = tmp_path / "no-uvicorn" / "uvicorn"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'uvicorn'\", name='uvicorn')\n")
    repo = Path(__file__).resolve().parents[2]
    path = os.pathsep.join([str(shadow.parent), str(repo), *site.getsitepackages()])  # orch and its libraries
    res = subprocess.run([str(env / "bin" / "python"), "-m", "orchestrator.cli.main", "ui"], cwd=project.path,
                         capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": path})
    assert res.returncode == 2 and res.stdout == ""
    assert f"hint: {says}" in res.stderr and "pip install" not in res.stderr.replace("pipx install", "")


def test_the_gpu_map_shows_who_holds_which_gpu_and_its_utilisation_over_time(project, server, page):
    import time

    now = time.time()
    with project.registry() as reg:  # what status records of a run given GPUs (orch deploy --gpus 2)
        reg.create(project="tinylm", target="local", revision="r", command="python3 train.py", status="finished",
                   message="old", gpus=[{"index": 0, "uuid": "GPU-a"}], gpu_series=[[now - 3600, [[90, 1000]]]])
        reg.create(project="tinylm", target="local", revision="r", command="python3 train.py", status="running",
                   message="two GPUs", gpus=[{"index": 2, "uuid": "GPU-c"}, {"index": 3, "uuid": "GPU-d"}],
                   gpu_series=[[now - 300 + 60 * t, [[50 + t, 2000], [40 + t, 1800]]] for t in range(6)])
    page.goto(server.url)
    page.goto(server.base + "/#/gpus")
    chart = page.locator("#view[data-ready='1'] .chart[data-series='gpu-util-2']")
    chart.wait_for()
    assert chart.get_attribute("data-points") == "6"
    assert chart.locator(".gpu").all_inner_texts() == ["2", "3"]
    assert chart.locator(".state").inner_text() == "running"
    assert page.locator(".chart[data-series='gpu-util-1'] .gpu").all_inner_texts() == ["0"]
    page.wait_for_selector("#gpus", timeout=60000)  # orch gpus --json: this machine has no nvidia-smi
    assert "local" in page.inner_text("#gpus")
    shot(page, "8-gpus")
