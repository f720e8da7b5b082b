"""`orch status` and `experiments show` read the metric series the run's supervisor kept beside its log
(`agent/run/series.py`), not the log again; with `[metrics] patterns` (which need the lines) they read the log."""

from __future__ import annotations

import json

from tests.conftest import wait_for

TRAIN = ("import sys\nfor i in range(1, 3001):\n"
         "    sys.stdout.write(f'step={i} loss={1.0 + 1.0 / i:.6f} tok/s={10000 + i % 7}\\n')\n"
         "    if i % 1000 == 0:\n        sys.stdout.write(f'eval: loss={2.0 / i:.6f}\\n')\n")


def ended(project) -> None:
    run = project.run_dir(1)

    def saved() -> bool:  # the supervisor's last save of the series (deploy --wait may answer just before)
        state = run / "metrics.state.json"
        return (run / "exit.json").exists() and state.exists() and \
            json.loads(state.read_text())["log"] == (run / "train.log").stat().st_size

    wait_for(saved, timeout=30, what="the series' last save")


def test_status_reads_the_series_the_supervisor_kept_not_the_log(project):
    (project.path / "train.py").write_text(TRAIN)
    assert project.run("deploy", "--wait").returncode == 0
    ended(project)
    log = project.run_dir(1) / "train.log"
    log.write_text(" " * log.stat().st_size)  # its lines gone: only the series can say where the run got to
    res = project.run("status", "--json")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)["summary"]
    assert summary["step"] == 3000 and summary["loss"] == 1.000333 and summary["eval_loss"] == 0.000667
    assert not summary["notes"]
    with project.registry() as reg:
        stored = reg.metrics(1)
    assert stored["summary"]["_state"]["complete"] and stored["summary"]["_state"]["source"] == "series"
    assert set(stored["series"]) == {"loss", "tok_s", "val_loss"}
    res = project.run("experiments", "show", "1")
    assert res.returncode == 0 and "3000" in res.stdout


def test_metrics_patterns_read_the_log_itself(project):
    (project.path / "train.py").write_text(TRAIN + "print('gpu mem=3.5G', flush=True)\n")
    project.configure(extra="\n[metrics]\npatterns = { gpu_mem = 'mem=([0-9.]+)G' }\n")
    assert project.run("deploy", "--wait").returncode == 0
    ended(project)
    res = project.run("status", "--json")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)["summary"]
    assert summary["step"] == 3000 and summary["metrics"]["gpu_mem"] == 3.5
    with project.registry() as reg:
        assert reg.metrics(1)["summary"]["_state"]["source"] == "log"


LONG = ("import sys\nfor i in range(1, 20001):\n"
        "    sys.stdout.write(f'step={i} loss={1.0 + 1.0 / i:.6f} tok/s={10000 + i % 7}\\n')\n"
        "    if i % 1000 == 0:\n        sys.stdout.write(f'eval: loss={2.0 / i:.6f} acc={i / 20000}\\n')\n")


def test_the_first_status_of_a_long_series_shows_its_last_step_exact_and_reads_the_rest_after(project, monkeypatch):
    from orchestrator.watch import metrics_view

    (project.path / "train.py").write_text(LONG)
    assert project.run("deploy", "--wait").returncode == 0
    ended(project)
    # a long series read a few bytes at a time, one read a status: only its supervisor's summary can say the end
    monkeypatch.setattr(metrics_view, "CHUNK", 4096)
    monkeypatch.setattr(metrics_view, "SERIES_CHUNK", 4096, raising=False)
    monkeypatch.setattr(metrics_view, "SUMMED_BUDGET_S", 0.0, raising=False)
    res = project.cli("status", "--json")
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)["summary"]
    assert summary["step"] == 20000 and summary["loss"] == 1.00005 and summary["min_loss"] == 1.00005
    assert summary["eval_loss"] == 0.0001 and summary["best"]["val_acc"] == 1.0 and summary["best"]["loss"] == 1.00005
    assert any(n.startswith("metrics read up to byte") for n in summary["notes"])  # the series: the rest next time
    with project.registry() as reg:
        read = reg.metrics(1)["summary"]["_state"]
    assert 0 < read["series_offset"] < read["size"] and not read["complete"]
    res = project.cli("experiments", "show", "1", "--json")  # the same for show, which reads on
    assert res.exit_code == 0, res.output
    shown = json.loads(res.stdout)
    assert shown["metrics"]["step"] == 20000 and shown["metrics_read"]["offset"] > read["series_offset"]
    monkeypatch.setattr(metrics_view, "SERIES_CHUNK", 16 << 20, raising=False)
    res = project.cli("status", "--json")  # the rest of it read: the summary from the series itself, the same
    assert json.loads(res.stdout)["summary"]["step"] == 20000
    with project.registry() as reg:
        assert reg.metrics(1)["summary"]["_state"]["complete"]


def test_a_status_with_nothing_new_writes_nothing(project):
    # a status of an ended run read to its end stores the same again: it writes nothing (no sync of the file, no
    # write lock a command beside it waits for), and shows the same
    (project.path / "train.py").write_text(TRAIN)
    assert project.run("deploy", "--wait").returncode == 0
    ended(project)
    shown = [project.run("status", "--json") for _ in range(2)]
    with project.registry() as reg:
        updated = reg.metrics(1)["updated"]
    again = project.run("status", "--json")
    with project.registry() as reg:
        assert reg.metrics(1)["updated"] == updated
    assert json.loads(again.stdout)["summary"] == json.loads(shown[-1].stdout)["summary"]
    assert json.loads(again.stdout)["summary"]["step"] == 3000
