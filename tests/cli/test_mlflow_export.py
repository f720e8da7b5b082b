"""`orch experiments export --mlflow` and `[mlflow] mirror`, through the real CLI, into real MLflow stores
(SQLite files, as `mlflow ui --backend-store-uri` reads them), read back with MLflow's own client. Most tests'
stores begin empty, as copies of one MLflow made (``tests/mlflow_stores.py``); the metric points' test lets the
export make its store."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

from tests.conftest import snapshot, tmux_socket, wait_for
from tests.mlflow_stores import empty_store

import mlflow  # the real library: make setup installs the mlflow extra
from mlflow import MlflowClient


def store(project) -> str:
    return f"sqlite:///{project.path / '.orch' / 'mlflow.db'}"


def runs(uri: str, name: str = "tinylm") -> dict[int, object]:
    """The MLflow runs of experiment ``name`` by orch experiment id; fails on two runs for one experiment."""
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(name)
    assert found is not None, f"no MLflow experiment {name!r} in {uri}"
    mlflow.set_tracking_uri(uri)  # the fluent API reads the process's tracking URI
    try:
        listed = mlflow.search_runs(experiment_ids=[found.experiment_id], output_format="list")
    finally:  # set_tracking_uri also sets it in the environment, which the next CLI would inherit
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    ids = [int(r.data.tags["orch.experiment"]) for r in listed]
    assert len(ids) == len(set(ids)), f"an experiment has several runs: {sorted(ids)}"
    return {int(r.data.tags["orch.experiment"]): r for r in listed}


def history(uri: str, run, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in MlflowClient(uri).get_metric_history(run.info.run_id, key)]


def registry_points(project, exp_id: int, key: str) -> list[tuple[int, float]]:
    from orchestrator.watch.metrics import Series

    with project.registry() as reg:
        stored = reg.metrics(exp_id)
    return [(int(x), y) for x, y in Series.from_dict(stored["series"][key]).points()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_export_writes_each_experiment_as_one_run_and_again_duplicates_nothing(project, tmp_path):
    empty_store(project.path / ".orch" / "mlflow.db")
    assert project.run("deploy", "--wait", "-m", "first").returncode == 0
    res = project.run("restart", "--wait", "--clean-checkpoints", "--yes", "-m", "second")
    assert res.returncode == 0, res.stderr
    res = project.run("experiments", "export", "--mlflow")
    assert res.returncode == 0, res.stderr
    assert "experiment 1: MLflow run" in res.stdout and "(new;" in res.stdout
    uri = store(project)
    assert f"to {uri}, MLflow experiment 'tinylm'" in res.stdout
    found = runs(uri)
    assert sorted(found) == [1, 2]
    with project.registry() as reg:
        exps = {i: reg.get(i) for i in (1, 2)}
        registry_id = reg.registry_id
    for i, run in found.items():
        exp = exps[i]
        params, tags = run.data.params, run.data.tags
        # params: the recorded settings, the batching section flattened as batching.*
        assert params["batching.strategy"] == "megabatch" and params["batching.token_budget"] == "4096"
        assert params["project.name"] == "tinylm" and params["run.stop_timeout"] == "5.0"
        assert json.loads(params["project.sources"]) == ["train.py"]
        assert tags["orch.revision"] == exp.revision and tags["orch.target"] == "local"
        assert tags["orch.registry"] == registry_id and tags["orch.experiment"] == str(i)
        assert tags["orch.checkpoints_action"] == exp.checkpoints_action
        assert tags["mlflow.runName"] == f"exp {i}: {exp.message}" == run.info.run_name
        assert tags["orch.status"] == "finished" and run.info.status == "FINISHED"
        assert run.info.start_time == int(exp.started * 1000) and run.info.end_time == int(exp.ended * 1000)
        # the log, read from the target, as an artifact
        got = Path(MlflowClient(uri).download_artifacts(run.info.run_id, "train.log", str(tmp_path)))
        assert got.read_bytes() == (project.run_dir(i) / "train.log").read_bytes()
    assert found[2].data.tags["mlflow.parentRunId"] == found[1].info.run_id
    assert "mlflow.parentRunId" not in found[1].data.tags
    assert exps[2].checkpoints_action == "moved" and found[2].data.tags["orch.checkpoints_entry"]
    for i in (1, 2):  # the series with their steps, as the registry holds them
        for key in ("loss", "tok_s"):
            assert history(uri, found[i], key) == registry_points(project, i, key)
    assert [s for s, _ in history(uri, found[1], "loss")] == [10, 20, 30, 40]
    # again: the same two runs, no point twice, nothing new
    again = project.run("experiments", "export", "--mlflow")
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("(unchanged; 0 new params, 0 new metric points; log: unchanged)") == 2
    second = runs(uri)
    assert {i: r.info.run_id for i, r in second.items()} == {i: r.info.run_id for i, r in found.items()}
    assert history(uri, second[1], "loss") == history(uri, found[1], "loss")


def test_each_metric_point_has_the_time_its_line_was_read(project):
    # from the series the run's supervisor kept: each point when its line was read, not all at the run's end
    project.configure(sleep=0.05)  # loss every 10 steps, half a second apart: several of the supervisor's reads
    assert project.run("deploy", "--wait").returncode == 0
    run_dir = project.run_dir(1)

    def saved() -> bool:  # the supervisor's last read of the log (deploy --wait may answer just before it)
        state = run_dir / "metrics.state.json"
        return (run_dir / "exit.json").exists() and state.exists() and \
            json.loads(state.read_text())["log"] == (run_dir / "train.log").stat().st_size

    wait_for(saved, timeout=30, what="the series' last save")
    res = project.run("experiments", "export", "--mlflow")
    assert res.returncode == 0, res.stderr
    uri = store(project)
    run = runs(uri)[1]
    with project.registry() as reg:
        exp = reg.get(1)
    points = MlflowClient(uri).get_metric_history(run.info.run_id, "loss")
    assert [m.step for m in points] == [10, 20, 30, 40]
    stamps = [m.timestamp for m in points]
    assert stamps == sorted(set(stamps)), stamps  # one after the other, none at the same time
    assert exp.started * 1000 - 1000 <= stamps[0] and stamps[-1] <= exp.ended * 1000 + 1000


def test_a_running_experiment_then_stopped_and_exported_again(project):
    empty_store(project.path / ".orch" / "mlflow.db")
    project.configure(steps=100000, sleep=0.02)
    assert project.run("deploy", "-m", "long").returncode == 0
    wait_for(lambda: "step=20 " in (project.run_dir(1) / "train.log").read_text(), timeout=60, what="step 20")
    res = project.run("experiments", "export", "--mlflow", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert [r["experiment"] for r in out["runs"]] == [1] and out["runs"][0]["run"] == "new"
    uri = store(project)
    run = runs(uri)[1]
    assert run.info.status == "RUNNING" and run.data.tags["orch.status"] == "running"
    before = history(uri, run, "loss")
    assert before and before[0][0] == 10
    assert project.run("stop").returncode == 0
    res = project.run("experiments", "export", "--mlflow", "-e", "1")
    assert res.returncode == 0, res.stderr
    run = runs(uri)[1]
    with project.registry() as reg:
        exp = reg.get(1)
    assert exp.status == "stopped"
    assert run.info.status == "KILLED" and run.info.end_time == int(exp.ended * 1000)
    after = history(uri, run, "loss")
    steps = [s for s, _ in after]
    assert len(steps) == len(set(steps)) and len(after) > len(before)  # each step once, the new ones added
    assert set(before) <= set(after)


def test_the_uri_comes_from_the_argument_then_orch_toml_then_the_environment(project, tmp_path):
    assert project.run("deploy", "--wait").returncode == 0
    env_store, toml_store, arg_store = (empty_store(tmp_path / f"{n}.db") for n in ("env", "toml", "arg"))
    env = {"MLFLOW_TRACKING_URI": env_store}
    assert project.run("experiments", "export", "--mlflow", "--no-log", env=env).returncode == 0
    assert list(runs(env_store)) == [1]
    assert not (project.path / ".orch" / "mlflow.db").exists()
    project.configure(extra=f'\n[mlflow]\ntracking_uri = "{toml_store}"\nexperiment = "tiny-runs"\n')
    res = project.run("experiments", "export", "--mlflow", "--no-log", env=env)
    assert res.returncode == 0 and "MLflow experiment 'tiny-runs'" in res.stdout
    assert list(runs(toml_store, "tiny-runs")) == [1]
    res = project.run("experiments", "export", "--mlflow", arg_store, "-e", "1", "--no-log", env=env)
    assert res.returncode == 0, res.stderr
    assert list(runs(arg_store, "tiny-runs")) == [1]
    assert "train.log" not in [a.path for a in MlflowClient(arg_store).list_artifacts(runs(arg_store, "tiny-runs")[1]
                                                                                      .info.run_id)]


def test_mirror_follows_deploy_stop_and_status_with_one_run_each(project):
    empty_store(project.path / ".orch" / "mlflow.db")
    project.configure(steps=100000, sleep=0.02, extra="\n[mlflow]\nmirror = true\n")
    res = project.run("deploy", "-m", "mirrored")
    assert res.returncode == 0, res.stderr
    uri = store(project)
    run = runs(uri)[1]  # no export was typed
    assert run.info.status == "RUNNING" and run.data.tags["mlflow.runName"] == "exp 1: mirrored"
    assert project.run("stop").returncode == 0
    assert runs(uri)[1].info.status == "KILLED"
    project.configure(steps=40, extra="\n[mlflow]\nmirror = true\n")
    assert project.run("deploy", "--clean-checkpoints", "--yes", "-m", "to the end").returncode == 0
    wait_for(lambda: (project.run_dir(2) / "exit.json").exists(), timeout=60, what="experiment 2's end")
    status = project.run("status")  # its reconcile records the end, and the mirror follows
    assert status.returncode == 0, status.stderr
    found = runs(uri)
    assert sorted(found) == [1, 2]
    assert found[2].info.status == "FINISHED" and found[1].info.status == "KILLED"
    steps = [s for s, _ in history(uri, found[2], "loss")]
    assert steps and len(steps) == len(set(steps))
    assert "not mirrored" not in status.stderr


def test_a_mirror_that_fails_is_a_warning_and_the_command_stands(project):
    port = free_port()
    project.configure(steps=40, extra=f'\n[mlflow]\nmirror = true\ntracking_uri = "http://127.0.0.1:{port}"\n')
    res = project.run("deploy", "--wait", "-m", "no server")
    assert res.returncode == 0, res.stderr
    assert f"warning: experiment(s) 1 not mirrored to MLflow (http://127.0.0.1:{port})" in res.stderr
    assert "cannot reach the MLflow tracking server" in res.stderr
    with project.registry() as reg:
        assert reg.get(1).status in ("running", "finished")  # recorded as launched, whatever MLflow said
    # the export itself says it, as an error with a hint, exit 3
    res = project.run("experiments", "export", "--mlflow", "--no-log")
    assert res.returncode == 3
    assert "error: cannot reach the MLflow tracking server" in res.stderr and "hint: start it" in res.stderr


def test_a_log_whose_target_is_gone_is_said_and_the_rest_exported(project, tmp_path, request):
    empty_store(project.path / ".orch" / "mlflow.db")
    other = tmp_path / "other-root"
    # the project fixture ends only its own root's tmux server: this one, with its standby agent, would stay
    request.addfinalizer(lambda: subprocess.run(["tmux", "-L", tmux_socket(str(other)), "kill-server"],
                                                capture_output=True))
    two = f'\n[targets.other]\nkind = "local"\nroot = "{other}"\ncheckpoints = "{other}/ckpt"\n'
    project.configure(extra=two)
    assert project.run("deploy", "--wait", "--target", "other").returncode == 0
    wait_for(lambda: (other / "runs" / project.run_key(1) / "exit.json").exists(), timeout=60, what="the end")
    assert project.run("status", "--target", "other").returncode == 0  # the end and the metrics recorded
    # the machine is unreachable now: an ssh host on a port nothing listens on
    project.configure(extra=f'\n[targets.other]\nkind = "ssh"\nhost = "127.0.0.1"\nport = {free_port()}\n'
                            f'root = "{other}"\n')
    res = project.run("experiments", "export", "--mlflow")
    assert res.returncode == 0, res.stderr
    assert "the log of experiment(s) 1 on other is not exported: cannot connect" in res.stderr
    assert "(the rest is)" in res.stderr
    run = runs(store(project))[1]
    assert run.data.params["batching.strategy"] == "megabatch" and run.info.status == "FINISHED"
    assert [s for s, _ in history(store(project), run, "loss")] == [10, 20, 30, 40]
    assert MlflowClient(store(project)).list_artifacts(run.info.run_id) == []


def test_bad_input_is_refused_and_changes_nothing(project, tmp_path):
    assert project.run("deploy", "--wait").returncode == 0
    before = snapshot(project.path / ".orch")
    res = project.run("experiments", "export")
    assert res.returncode == 2 and "error: orch experiments export needs a destination" in res.stderr
    assert "hint: orch experiments export --mlflow" in res.stderr
    res = project.run("experiments", "export", "--mlflow", "-e", "9")
    assert res.returncode == 7 and "no experiment 9" in res.stderr
    project.configure(extra='\n[mlflow]\ntracking_uri = "http://me:s3cret@127.0.0.1:5000"\n')
    res = project.run("experiments", "export", "--mlflow")
    assert res.returncode == 2 and "mlflow.tracking_uri" in res.stderr and "MLFLOW_TRACKING_PASSWORD" in res.stderr
    assert "s3cret" not in res.stderr
    assert snapshot(project.path / ".orch") == before


def test_without_the_library_a_clear_error_and_the_mirror_a_warning(project, tmp_path):
    # the real CLI with mlflow shadowed on PYTHONPATH by a package that cannot be imported, as when it is absent
    shadow = tmp_path / "shadow" / "mlflow"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'mlflow'\", name='mlflow')\n")
    env = {"PYTHONPATH": str(shadow.parent)}
    assert project.run("deploy", "--wait", env=env).returncode == 0
    before = snapshot(project.path / ".orch")
    res = project.run("experiments", "export", "--mlflow", env=env)
    assert res.returncode == 2
    assert "error: exporting to MLflow needs the mlflow library, which is not installed" in res.stderr
    assert "hint: install orch's mlflow extra from its checkout or wheel: pip install '<orch checkout>[mlflow]'" \
        in res.stderr  # not PyPI's 'orch', another project
    assert snapshot(project.path / ".orch") == before and not (project.path / ".orch" / "mlflow.db").exists()
    project.configure(extra="\n[mlflow]\nmirror = true\n")
    res = project.run("restart", "--wait", env=env)
    assert res.returncode == 0, res.stderr
    assert "not mirrored to MLflow" in res.stderr and "pip install '<orch checkout>[mlflow]'" in res.stderr
