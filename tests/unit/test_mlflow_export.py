"""What an experiment becomes in MLflow (params, tags, points) and where it goes, without a store."""

from __future__ import annotations

import pytest

from orchestrator.config import load_settings
from orchestrator.errors import ConfigError
from orchestrator.records.experiments import Experiment
from orchestrator.watch import mlflow_export as mx
from orchestrator.watch.metrics import Series


def experiment(**fields) -> Experiment:
    base = dict(id=7, project="tinylm", created=100.0, started=101.5, target="gpu", revision="ab" * 8,
                command=["python3", "train.py", "--lr", "3e-4"], status="finished", exit_code=0,
                target_info={"ct": 200, "node": "pve1"}, git_commit="c0ffee", git_dirty=True, parent=6,
                checkpoints_action="moved", checkpoints_entry="/t/exp6", message="lr 3e-4",
                config={"project": {"name": "tinylm", "env": {"A": "1"}, "sources": ["train.py"], "total_steps": None},
                        "run": {"stop_timeout": 5.0, "restarts": 0}, "batching": {"strategy": "ignored"}},
                batching={"strategy": "megabatch", "token_budget": 4096, "buckets": None})
    return Experiment.model_validate(base | fields)


def test_params_are_the_recorded_settings_flattened_and_the_batching_section():
    p = mx.params(experiment())
    assert p["project.name"] == "tinylm" and p["project.env.A"] == "1" and p["project.sources"] == '["train.py"]'
    assert p["project.total_steps"] == "null" and p["run.stop_timeout"] == "5.0" and p["run.restarts"] == "0"
    assert p["batching.strategy"] == "megabatch" and p["batching.token_budget"] == "4096"
    assert p["batching.buckets"] == "null"  # the recorded batching section, not the config's copy
    long = mx.params(experiment(config={"project": {"env": {"BIG": "x" * 7000, "a b/c:d!": "1"}}}))
    assert len(long["project.env.BIG"]) == mx.PARAM_LEN and long["project.env.BIG"].endswith("…")
    assert long["project.env.a b/c:d_"] == "1"  # a character MLflow refuses in a name is replaced


def test_tags_say_where_it_ran_what_it_was_and_its_parent():
    t = mx.tags(experiment(), "0123456789ab", "parent-run")
    assert t["orch.registry"] == "0123456789ab" and t["orch.experiment"] == "7"
    assert t["orch.revision"] == "ab" * 8 and t["orch.git_commit"] == "c0ffee" and t["orch.git_dirty"] == "true"
    assert t["orch.target"] == "gpu" and t["orch.ct"] == "200" and t["orch.node"] == "pve1"
    assert t["orch.checkpoints_action"] == "moved" and t["orch.checkpoints_entry"] == "/t/exp6"
    assert t["orch.command"] == "python3 train.py --lr 3e-4" and t["orch.status"] == "finished"
    assert t["mlflow.parentRunId"] == "parent-run" and t["mlflow.runName"] == "exp 7: lr 3e-4"
    bare = mx.tags(experiment(parent=None, message=None, git_commit=None, git_dirty=None, target_info={}), "r", None)
    assert "mlflow.parentRunId" not in bare and "orch.git_dirty" not in bare and "orch.ct" not in bare
    assert bare["mlflow.runName"] == "exp 7"


def test_every_status_has_an_mlflow_status():
    from orchestrator.records.experiments import STATUSES

    assert set(mx.STATUS) == set(STATUSES)
    assert set(mx.STATUS.values()) <= {"RUNNING", "SCHEDULED", "FINISHED", "FAILED", "KILLED"}
    assert (mx.STATUS["finished"], mx.STATUS["crashed"], mx.STATUS["stopped"]) == ("FINISHED", "FAILED", "KILLED")


def test_points_are_the_series_one_per_step():
    s = Series(max_points=16)
    for step in range(1, 200):
        s.add(float(step), 10.0 / step)
    s.add(199.0, 0.01)  # a second value for the last step: the last one counts
    points = mx.metric_points({"series": {"loss": s.to_dict()}})["loss"]
    steps = [p[0] for p in points]
    assert steps == sorted(set(steps)) and steps[0] == 1 and steps[-1] == 199
    assert dict(points)[199] == 0.01 and len(points) <= 16
    assert mx.metric_points(None) == {}


def test_the_uri_precedence_and_the_default_store(tmp_path, monkeypatch):
    (tmp_path / "orch.toml").write_text('[project]\nname = "p"\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    settings = load_settings(tmp_path / "orch.toml", env={})
    assert mx.tracking_uri(settings) == f"sqlite:///{tmp_path / '.orch' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://env:5000")
    assert mx.tracking_uri(settings) == "http://env:5000"
    (tmp_path / "orch.toml").write_text('[project]\nname = "p"\n[mlflow]\ntracking_uri = "sqlite:///runs.db"\n')
    settings = load_settings(tmp_path / "orch.toml", env={})
    assert mx.tracking_uri(settings) == f"sqlite:///{tmp_path / 'runs.db'}"  # beside orch.toml, wherever orch runs
    assert mx.tracking_uri(settings, "http://given:1") == "http://given:1"


def test_a_password_is_never_recorded_nor_printed(tmp_path):
    (tmp_path / "orch.toml").write_text('[mlflow]\ntracking_uri = "https://u:hunter2@mlflow.example/"\n')
    with pytest.raises(ConfigError) as err:
        load_settings(tmp_path / "orch.toml", env={})
    assert "mlflow.tracking_uri" in err.value.message and "hunter2" not in err.value.message
    assert mx.shown("https://u:hunter2@mlflow.example:8443/x") == "https://u:***@mlflow.example:8443/x"
    assert mx.shown("sqlite:////a/b.db") == "sqlite:////a/b.db"
