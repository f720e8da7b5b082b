"""A conductor that ends inside an ask (the CT it conducts on goes down, a kill): Optuna's ``ask`` stores each
parameter as it draws it, so the trial is left with some of them. The trial it launches or queues when it comes back
has every parameter, those drawn before as they were (it had run with the command's defaults in their place, and
``sweep show`` then failed on it); and a table with such a trial in it still draws. Real Optuna, a SQLite study."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from orchestrator.launch import search_view, space
from orchestrator.launch.study import Study, _distribution

SETS = ["project.env.LR=loguniform(1e-5,1.0)", "project.env.WD=uniform(0.0,0.3)", "project.env.OPT=adam,sgd"]
KEYS = {"project.env.LR", "project.env.WD", "project.env.OPT"}


def cut_ask(study, first: str, dist) -> int:
    """What a conductor that ended inside ``study.ask`` leaves: a running trial with its first parameter alone."""
    trial = study.ask()
    trial._suggest(first, dist)
    assert set(study.trials[trial.number].params) == {first}
    return trial.number


def test_the_controllers_conductor_draws_the_rest_of_a_cut_trial(tmp_path):
    axes = space.axes(SETS)
    study = Study.open(tmp_path / "study.db", "s1", sampler="random", space=axes, trials=6, seed=3, create=True)
    number = cut_ask(study.study, "project.env.LR", _distribution(study.optuna, axes["project.env.LR"]))
    lr = study.study.trials[number].params["project.env.LR"]
    params = study.drawn(number, axes)
    assert set(params) == KEYS and params["project.env.LR"] == lr
    assert 0.0 <= params["project.env.WD"] <= 0.3 and params["project.env.OPT"] in ("adam", "sgd")
    assert study.trials()[number]["params"] == params  # stored: the table shows what the trial ran with
    assert study.drawn(number, axes) == params  # asked again: the same


def test_the_conductor_on_the_target_draws_the_rest_of_a_cut_trial(tmp_path):
    from orchestrator.agent.queue import search, search_loop

    optuna = search.optuna_module()
    dists = {k: _distribution(optuna, d) for k, d in space.axes(SETS).items()}
    study = optuna.create_study(study_name="s2", storage=f"sqlite:///{tmp_path / 'study.db'}",
                                sampler=optuna.samplers.RandomSampler(seed=5))
    number = cut_ask(study, "project.env.WD", dists["project.env.WD"])
    wd = study.trials[number].params["project.env.WD"]
    conductor = SimpleNamespace(optuna=optuna, study=study, space=dists, changed=False)
    params = search_loop.Conductor._drawn(conductor, study.trials[number])
    assert set(params) == KEYS and params["project.env.WD"] == wd and conductor.changed
    assert study.trials[number].params == params


@pytest.mark.parametrize("missing", ["project.env.LR", "project.env.OPT"])
def test_a_trial_without_a_value_of_an_axis_is_left_off_the_plot_not_a_failed_show(missing):
    axes = space.axes(SETS)
    whole = {"project.env.LR": 1e-3, "project.env.WD": 0.1, "project.env.OPT": "adam"}
    trials = [{"number": n, "state": "complete", "params": dict(whole), "value": 1.0 + n, "intermediate": {},
               "attrs": {"steps": 30}} for n in range(3)]
    del trials[1]["params"][missing]
    spec = {"sweep": "s3", "mode": "min", "metric": "loss", "sampler": "random", "prune": "median",
            "rung_by": "steps", "trials": 3, "steps": 30}
    drawn = search_view.coordinates(search_view.table(spec, trials, "loss"), axes)
    assert sorted(line["trial"] for line in drawn["lines"]) == [0, 2]
    assert len(drawn["axes"]) == 4 and all(len(line["y"]) == 4 for line in drawn["lines"])
