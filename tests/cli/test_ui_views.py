"""``orch ui``'s views in a real browser (Playwright driving Debian's chromium), one browser for the module: the
chart controls by their ``data-`` attributes, the table's best and last columns, sorting and paging, grouping on
a compare chart, and a real run whose progress bar is drawn in the log panel and which ends while its page is open.

The recorded experiments are written to a real registry as ``orch status`` leaves them (series by step, a summary
made by the same functions); the run is a real one in tmux on the local target, through the real CLI.
"""

from __future__ import annotations

import json
import math

import pytest

from tests.cli.test_ui import Server
from tests.conftest import wait_for

# a loss from 0.33 down to 0.000558 and up to 0.000636 at its end: a flat line after step 50 without a log scale
LOSS = [0.33 * math.exp(-i / 12) + 0.00055 for i in range(120)] + [0.000558, 0.000601, 0.000636]


VIEWPORT = {"width": 1360, "height": 1000}


@pytest.fixture
def server(project):
    srv = Server(project)
    yield srv
    if srv.proc.poll() is None:
        assert srv.close() == 0


def record(reg, i: int, strategy: str, series: dict[str, list[tuple[float, float]]], tokens: float | None = None):
    """A finished experiment with the series and the summary ``orch status`` would have stored."""
    from orchestrator.watch.metrics import Series, best_of

    exp = reg.create(project="tinylm", target="local", revision="r", command="python3 train.py", status="finished",
                     exit_code=0, started=1_700_000_000.0 + i, ended=1_700_000_600.0 + i, message=f"run {i}",
                     batching={"strategy": strategy}, config={"run": {"seed": i}})
    stored = {}
    for name, pts in series.items():
        s = Series()
        for x, y in pts:
            s.add(x, y)
        stored[name] = s.to_dict()
    last_step = max(x for pts in series.values() for x, _ in pts)
    summary = {"step": last_step, "loss": series["loss"][-1][1], "best": best_of(stored),
               "metrics": {k: v[-1][1] for k, v in series.items()}, "median_tok_s": 15000.0 + i,
               "_state": {"first_step": 0, "last_step": last_step, "complete": True,
                          **({"tokens": tokens} if tokens else {})}}
    if "val_loss" in series:
        summary.update(eval_loss=series["val_loss"][-1][1], eval_metric="val_loss")
    reg.save_metrics(exp.id, 1000, stored, summary)
    return exp


def loss_run(scale: float = 1.0) -> dict:
    steps = [(10.0 * k, v * scale) for k, v in enumerate(LOSS)]
    return {"loss": steps, "val_loss": [(600.0, 0.41 * scale)],  # evaluated once: a single point
            "lr": [(x, 3e-4) for x, _ in steps], "grad_norm": [(x, 1 + k % 3) for k, (x, _) in enumerate(steps)],
            "tok_s": [(x, 15000.0) for x, _ in steps], "val_acc": [(600.0, 0.7)], "mfu": [(x, 0.4) for x, _ in steps],
            "weird_metric": [(x, 2.0) for x, _ in steps]}


def colour_pixels(page, selector: str, rgb: tuple[int, int, int]) -> int:
    """How many pixels of the chart's canvas are (nearly) ``rgb``: what uPlot drew of a series."""
    return page.eval_on_selector(selector + " canvas", """(c, rgb) => {
        const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data; let n = 0;
        for (let i = 0; i < d.length; i += 4)
          if ([0, 1, 2].every(k => Math.abs(d[i + k] - rgb[k]) < 40) && d[i + 3] > 100) n++;
        return n; }""", list(rgb))


def test_every_metric_from_the_picker_on_a_log_scale_smoothed_by_step_time_or_tokens(project, server, page):
    with project.registry() as reg:
        record(reg, 1, "megabatch", loss_run(), tokens=4_800_000)
    page.goto(server.url)
    page.goto(server.base + "/#/exp/1")
    page.wait_for_selector("#view[data-ready='1'] .chart[data-series='loss']")
    picker = page.locator("[data-control='metric'] option")
    assert sorted(picker.all_inner_texts()) == sorted(loss_run())  # one option per series the run printed
    shown = page.eval_on_selector_all(".chart", "cs => cs.map(c => c.dataset.series)")
    assert shown == ["loss", "val_loss", "tok_s", "lr", "grad_norm"]  # the known ones, in a stable order
    assert "weird_metric" not in shown
    page.select_option("[data-control='metric']", "weird_metric")
    chart = page.locator(".chart[data-series='weird_metric']")
    wait_for(lambda: chart.get_attribute("data-points") == str(len(LOSS)), what="the picked metric's chart")
    assert page.locator(".chart[data-series='mfu']").count() == 0

    # a single eval point is drawn, as a point
    wait_for(lambda: colour_pixels(page, ".chart[data-series='val_loss']", (0x24, 0x63, 0xeb)) > 0,
             what="the single eval point drawn")

    loss = ".chart[data-series='loss']"
    assert page.get_attribute(loss, "data-scale") == "linear"
    page.check("[data-control='logy']")
    wait_for(lambda: page.get_attribute(loss, "data-scale") == "log", what="the log scale")
    assert page.eval_on_selector_all(".chart", "cs => cs.every(c => c.dataset.scale === 'log')")

    assert page.get_attribute(loss, "data-smoothing") == "0"
    page.fill("[data-control='smoothing']", "0.9")
    wait_for(lambda: page.get_attribute(loss, "data-smoothing") == "0.9", what="smoothing")
    legend = page.locator(loss + " .u-legend .u-series").all_inner_texts()
    assert any("(raw)" in t for t in legend) and len(legend) == 3  # x, the faint raw line, the smoothed one

    for x in ("time", "tokens", "step"):
        page.select_option("[data-control='xaxis']", x)
        wait_for(lambda: page.get_attribute(loss, "data-x") == x, what=f"the {x} axis")
    page.select_option("[data-control='xaxis']", "tokens")
    wait_for(lambda: "tokens" in page.inner_text(loss), what="the tokens axis label")
    assert page.get_attribute(loss, "data-points") == str(len(LOSS))


def test_the_table_sorts_and_pages_with_the_best_and_last_loss_to_three_digits(project, server, page):
    with project.registry() as reg, reg.batch():
        record(reg, 1, "megabatch", loss_run())
        for i in range(2, 131):
            record(reg, i, ("megabatch", "shuffle")[i % 2], {"loss": [(0.0, 3.0), (10.0, 1.0 + i / 100), (20.0, 2.0)]})
    page.goto(server.url)
    page.wait_for_selector("#view[data-ready='1'] tr[data-experiment-id]")
    assert page.locator("tr[data-experiment-id]").count() == 100  # the first page only
    assert page.inner_text("[data-count]") == "1–100 of 130"
    page.click("[data-page='next']")
    wait_for(lambda: page.inner_text("[data-count]") == "101–130 of 130", what="the second page")
    row = page.locator("tr[data-experiment-id='1']")
    assert row.locator("td[data-column='best:loss']").inner_text() == "5.58e-4"  # the lowest, not the last
    assert row.locator("td[data-column='last:loss']").inner_text() == "6.36e-4"
    assert row.locator("td[data-column='last:eval_loss']").inner_text() == "0.41"
    assert page.locator("tr[data-experiment-id='2'] td[data-column='best:loss']").inner_text() == "1.02"

    ids = lambda: page.eval_on_selector_all("tr[data-experiment-id]", "rs => rs.map(r => r.dataset.experimentId)")
    page.click("th[data-sort='best:loss']")  # a loss sorts best first: the lowest at the top
    wait_for(lambda: page.get_attribute("th[data-sort='best:loss']", "data-dir") == "asc", what="lowest first")
    wait_for(lambda: ids()[:3] == ["1", "2", "3"], what="the lowest best loss first")
    page.click("th[data-sort='best:loss']")  # again: the other way
    wait_for(lambda: ids()[:2] == ["130", "129"], what="the highest best loss first")
    assert page.inner_text("[data-count]") == "1–100 of 130"
    page.click("th[data-sort='message']")
    wait_for(lambda: page.get_attribute("th[data-sort='message']", "data-dir") == "asc", what="by message")
    wait_for(lambda: page.locator("tr[data-experiment-id] td.msg").first.inner_text() == "run 1", what="run 1 first")


def test_a_table_request_refused_while_the_scripts_load_is_said_and_asked_again(project, server, page):
    """The page asks for the table before its scripts load: a refused connection then is handled (the page fixture
    fails the test on an unhandled rejection), said, and the table asked for again."""
    with project.registry() as reg:
        record(reg, 1, "megabatch", loss_run())
    refused: list[str] = []
    held: list = []

    def table(route):
        if len(refused) < 2:  # the page's own early request, and the first one app.js makes
            refused.append(route.request.url)
            route.abort("connectionrefused")
            for waiting in held:  # the scripts come once the early request has failed
                waiting.continue_()
            held.clear()
        else:
            route.continue_()

    page.route("**/api/table*", table)
    page.route("**/static/app.js", lambda route: route.continue_() if refused else held.append(route))
    page.goto(server.url)
    toast = page.locator("#toast.error")
    toast.wait_for()
    assert "no answer from orch ui" in toast.inner_text(), toast.inner_text()
    page.wait_for_selector("#view[data-ready='1'] tr[data-experiment-id='1']", timeout=30000)  # asked again
    assert len(refused) == 2


def test_a_compare_chart_groups_runs_by_a_setting_zooms_and_shows_every_runs_value(project, server, page):
    with project.registry() as reg:
        for i, (strategy, scale) in enumerate([("megabatch", 1.0), ("megabatch", 1.4), ("shuffle", 2.0),
                                                ("shuffle", 2.6)], start=1):
            record(reg, i, strategy, loss_run(scale))
    page.goto(server.url)
    page.goto(server.base + "/#/compare?ids=1,2,3,4")
    loss = ".chart[data-series='loss']"
    page.wait_for_selector(f"#view[data-ready='1'] {loss}")
    wait_for(lambda: page.get_attribute(loss, "data-points") == str(4 * len(LOSS)), what="four runs' points")
    # hover: each run's value at the cursor, in the legend
    page.locator(loss).scroll_into_view_if_needed()
    box = page.locator(loss + " .u-over").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.05, box["y"] + box["height"] / 2, steps=4)
    values = lambda: page.locator(loss + " .u-legend .u-series .u-value").all_inner_texts()
    wait_for(lambda: len(values()) == 5 and all(v not in ("", "-", "--") for v in values()), what="hover values")
    assert len(set(values()[1:])) == 4  # each run's own value
    # zoom: a drag across the chart narrows its x range
    top = lambda: float(page.get_attribute(loss, "data-xmax") or "nan")
    assert top() == 1220
    page.mouse.move(box["x"] + 10, box["y"] + 20)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.3, box["y"] + 40, steps=5)
    page.mouse.up()
    wait_for(lambda: top() < 600, what="the zoomed x range")  # the steps to 1,220 are out of view

    assert page.eval_on_selector_all("[data-control='group'] option", "os => os.map(o => o.value)")[:2] == \
        ["", "batching.strategy"]
    page.select_option("[data-control='group']", "batching.strategy")
    wait_for(lambda: page.get_attribute(loss, "data-group") == "batching.strategy", what="grouped")
    legend = page.locator(loss + " .u-legend .u-series .u-label").all_inner_texts()
    assert "mean of batching.strategy=megabatch (2 runs)" in legend
    assert "mean of batching.strategy=shuffle (2 runs)" in legend
    assert legend.count("min") == 2 and legend.count("max") == 2  # the band's edges
    page.dblclick(loss + " .u-over")  # the whole range again
    wait_for(lambda: top() > 1000, what="the zoom reset")


BAR = r'''import sys, time
n = int(sys.argv[1])
print("GPU available: False, used: False", flush=True)
for epoch in range(2):
    for i in range(1, n + 1):
        loss = 0.33 / (epoch * n + i)
        bar = "#" * (10 * i // n)
        # Lightning's tqdm bar: redrawn in place, its cursor moved up and back as tqdm does beside another bar
        sys.stdout.write(f"\rEpoch {epoch}: {100 * i // n:3d}%|{bar:<10}| {i}/{n} [00:01<00:01, 7.50it/s, v_num=0, "
                         f"train_loss={loss:.6f}]\x1b[A\x1b[B")
        sys.stdout.flush()
        time.sleep(0.2)
    sys.stdout.write("\n")
print("`Trainer.fit` stopped: `max_epochs=2` reached.", flush=True)
'''


def test_the_log_panel_draws_the_moving_bar_and_the_page_follows_its_run_to_the_end(project, server, page):
    (project.path / "bar.py").write_text(BAR)
    text = (project.path / "orch.toml").read_text()
    (project.path / "orch.toml").write_text(text.replace('sources = ["train.py"]', 'sources = ["bar.py"]')
                                            .replace('command = "python3 train.py"', 'command = "python3 bar.py 40"'))
    res = project.cli("deploy", "-m", "lightning bar", "--wait")
    assert res.exit_code == 0, res.output
    page.goto(server.url)
    page.goto(server.base + "/#/exp/1")
    page.wait_for_selector("#view[data-ready='1'] .chart[data-series='loss']")
    assert page.locator("[data-action='stop']").is_enabled()
    current = page.locator("#log [data-current]")
    wait_for(lambda: current.inner_text().startswith("Epoch 0:"), timeout=30, what="the moving bar")
    first = current.inner_text()
    wait_for(lambda: current.inner_text() != first, timeout=30, what="the bar to move")
    log = page.inner_text("#log")
    assert "\x1b" not in log and "[A" not in log and "[B" not in log  # no terminal escape reaches the panel
    assert log.count("Epoch 0:") == 1  # one line, redrawn in place, not one per redraw
    assert "train_loss=" in current.inner_text() and "it/s" in current.inner_text()

    # the run ends while its page is open: the page follows it there (nothing else asks the target meanwhile)
    page.wait_for_selector("h2 .state.finished", timeout=60000)
    assert not page.locator("[data-action='stop']").is_enabled()
    wait_for(lambda: page.get_attribute("#on-target", "data-state") == "finished", timeout=60,
             what="the target's state on the page")
    assert "● live" not in page.inner_text("h2")
    lines = page.inner_text("#log").splitlines()
    assert lines[-1].startswith("`Trainer.fit` stopped") and lines[-2].startswith("Epoch 1: 100%|##########| 40/40")
    assert page.inner_text("#log [data-current]") == ""
    points = int(page.get_attribute(".chart[data-series='loss']", "data-points"))
    assert points >= 60  # every redraw of the bar gave its loss
    show = json.loads(project.cli("experiments", "show", "1", "--json").stdout)
    assert show["status"] == "finished"
