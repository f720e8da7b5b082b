"""A search in ``orch ui`` (Playwright driving Debian's chromium) and in ``orch experiments plot --sweep``: the
parallel coordinates (one line per ended trial, the objective on the last axis, pruned trials grey) and a scatter
of the objective against each searched parameter, read through their ``data-`` attributes.

The study is a real Optuna study, made as the conductor makes one (``conductor.start``), its trials asked, reported
at rungs and told by the same Study the conductor uses; each trial's experiment is in a real registry with the
series ``orch status`` would have stored.
"""

from __future__ import annotations

import math

import pytest

from tests.cli.test_ui_views import VIEWPORT, record, server  # noqa: F401 (fixtures; the browser and page are tests/cli/conftest.py's)
from tests.conftest import wait_for

pytest.importorskip("optuna")

SETS = ["project.env.LR=loguniform(1e-5,1.0)", "project.env.WD=uniform(0.0,0.3)", "project.env.OPT=adam,sgd"]


def search(project, sweep: str = "s5ea2c11") -> dict[int, dict]:
    """Six trials: four complete, two pruned at their first rung; their experiments recorded. By trial number:
    the parameters, the objective and the state."""
    from orchestrator.launch import conductor, space
    from orchestrator.launch.study import Study

    spec = conductor.Spec(sweep=sweep, sets=SETS, trials=6, sampler="random", prune="median", steps=30,
                          min_steps=10, seed=7)
    axes = space.axes(SETS)
    study = conductor.start(project.path / ".orch", spec, axes, Study.open)
    study.set_attr("metric", "loss")  # as the conductor records the objective it chose from the first log
    out = {}
    with project.registry() as reg:
        for k in range(6):
            number, params = study.ask(axes)
            floor = (math.log10(params["project.env.LR"]) + 3) ** 2 + params["project.env.WD"]
            curve = [(float(s), floor + 2 / (1 + s / 10)) for s in range(1, 31)]
            pruned = k in (2, 4)
            if pruned:
                curve = curve[:12]
            exp = record(reg, k + 1, "sorted", {"loss": curve})
            reg.update(exp.id, sweep=sweep, message=f"sweep {sweep}: trial {number}: ...")
            study.trial_attr(number, "experiment", exp.id)
            study.trial_attr(number, "steps", curve[-1][0])
            for at in (10, 20, 30):
                if at <= curve[-1][0]:
                    study.report(number, at, curve[at - 1][1])
            if pruned:
                study.trial_attr(number, "pruned", {"rung": 1, "at": 10, "value": curve[9][1], "threshold": 0.5,
                                                    "step": 12, "unit": "steps"})
                study.tell(number, state="pruned")
                out[number] = {"params": params, "objective": curve[9][1], "state": "pruned"}
            else:
                study.tell(number, curve[-1][1])
                out[number] = {"params": params, "objective": curve[-1][1], "state": "complete"}
    return out


def test_a_search_is_drawn_as_parallel_coordinates_and_a_scatter_a_parameter(project, server, page):  # noqa: F811
    trials = search(project)
    page.goto(server.url)
    page.goto(server.base + "/#/sweep/s5ea2c11")
    page.wait_for_selector("#view[data-ready='1'] svg[data-chart='parallel']")
    chart = "svg[data-chart='parallel']"
    axes = page.eval_on_selector_all(chart + " g[data-axis]", "gs => gs.map(g => g.dataset.axis)")
    assert axes == ["project.env.LR", "project.env.OPT", "project.env.WD", "loss"], axes  # the objective last
    assert page.get_attribute(chart + " g[data-last]", "data-axis") == "loss"
    lines = page.eval_on_selector_all(chart + " polyline", """ls => ls.map(l => ({trial: +l.dataset.trial,
        state: l.dataset.state, best: l.dataset.best === "1", colour: l.getAttribute("stroke"),
        objective: +l.dataset.objective, points: l.getAttribute("points").split(" ").length}))""")
    assert sorted(ln["trial"] for ln in lines) == sorted(trials)  # one line per trial
    for ln in lines:
        assert ln["state"] == trials[ln["trial"]]["state"] and ln["points"] == 4, ln
        assert ln["objective"] == pytest.approx(trials[ln["trial"]]["objective"]), ln
        if ln["state"] == "pruned":
            assert ln["colour"] == "#b8b8b8" and not ln["best"], ln  # greyed
        else:
            assert ln["colour"] != "#b8b8b8", ln
    best = min((t for t in trials.values() if t["state"] == "complete"), key=lambda t: t["objective"])
    drawn_best = next(ln for ln in lines if ln["best"])
    assert drawn_best["objective"] == pytest.approx(best["objective"])
    scatters = page.eval_on_selector_all("svg[data-chart='scatter']", """ss => ss.map(s => ({param: s.dataset.param,
        points: [...s.querySelectorAll("circle")].map(c => [c.dataset.x, +c.dataset.y, c.dataset.state,
                                                             c.getAttribute("fill")])}))""")
    assert [s["param"] for s in scatters] == axes[:-1]
    lr = next(s for s in scatters if s["param"] == "project.env.LR")["points"]
    drawn = sorted((float(x), y, st) for x, y, st, _ in lr)
    wanted = sorted((t["params"]["project.env.LR"], t["objective"], t["state"]) for t in trials.values())
    assert [d[2] for d in drawn] == [w[2] for w in wanted], (drawn, wanted)
    assert [d[:2] for d in drawn] == [pytest.approx(w[:2]) for w in wanted], (drawn, wanted)
    assert all((fill == "#b8b8b8") == (st == "pruned") for _, _, st, fill in lr)
    rows = page.eval_on_selector_all("#search tbody tr", "rs => rs.map(r => [+r.dataset.trial, r.dataset.state])")
    assert len(rows) == 6 and rows[0][1] == "complete" and {s for _, s in rows} == {"complete", "pruned"}
    wait_for(lambda: page.locator(".chart[data-series='loss']").count() == 1, what="the trials' curves")


def test_experiments_plot_of_a_search_draws_its_coordinates_as_an_image(project):
    search(project, "s0be11a5")
    image = project.path / "search.png"
    done = project.run("experiments", "plot", "--sweep", "s0be11a5", "-o", str(image))
    assert done.returncode == 0, done.stderr
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from PIL import Image

    with Image.open(image) as im:  # parallel coordinates above three scatters: wider than a curve's chart
        wide, high = im.size
    assert wide >= 800 and high >= 700, (wide, high)
    curves = project.path / "curves.png"  # --metric still draws the trials' curves
    done = project.run("experiments", "plot", "--sweep", "s0be11a5", "--metric", "loss", "-o", str(curves))
    assert done.returncode == 0 and curves.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", done.stderr
