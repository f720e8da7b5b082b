"""``orch batching plan`` and ``optimize`` through typer's CliRunner on the sub-app."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from orchestrator.cli.batching import app
from orchestrator.errors import InputError

TOML = """# project settings
[batching]
# a comment the optimizer must keep
token_budget = 16384   # tokens per batch
max_seq_len = 4096
overlong = "truncate"
"""


@pytest.fixture
def project(tmp_path):
    rng = np.random.default_rng(0)
    lengths = np.clip(np.round(rng.lognormal(6.5, 0.8, 20_000)), 1, 5000).astype(np.int64)
    np.save(tmp_path / "lengths.npy", lengths)
    (tmp_path / "orch.toml").write_text(TOML)
    return tmp_path


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args], prog_name="orch batching")


def test_plan_table(project):
    result = invoke("plan", "--lengths", project / "lengths.npy", "--config", project / "orch.toml")
    assert result.exit_code == 0, result.output
    out = result.output
    for name in ("sorted", "shuffle", "bucketed K=6 optimized", "megabatch M=50 HF", "auto"):
        assert name in out
    assert "best: megabatch M=" in out and 'strategy = "megabatch"' in out
    assert "budget 16,384" in out and "max_seq_len 4,096" in out  # defaults from orch.toml
    assert "samples > max_seq_len (truncate" in out  # 5000 > 4096: counted and reported


def test_plan_json_only_json_with_flags_over_toml(project):
    result = invoke("plan", "--lengths", project / "lengths.npy", "--config", project / "orch.toml", "--json",
                    "--token-budget", "32768", "--window", "4")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["config"]["token_budget"] == 32768 and doc["config"]["window"] == 4
    assert doc["config"]["max_seq_len"] == 4096
    rows = {r["name"].split(" M=")[0] if "auto" not in r["name"] else "auto": r for r in doc["rows"]}
    assert rows["sorted"]["d1"] == 1.0 and rows["sorted"]["throughput_vs_sorted"] == 1.0
    assert rows["auto"]["recommended"] and rows["auto"]["configured"]
    assert rows["auto"]["efficiency_vs_sorted"] >= 0.99 and rows["auto"]["s_and_l"] == 1.0
    assert doc["recommended"] == rows["auto"]["name"]
    assert doc["overlong"]["truncated"] > 0


def test_plan_plot(project):
    pytest.importorskip("matplotlib")
    result = invoke("plan", "--lengths", project / "lengths.npy", "--config", project / "orch.toml",
                    "--plot", project / "plan.png")
    assert result.exit_code == 0, result.output
    assert (project / "plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_lengths_from_toml(project):
    (project / "orch.toml").write_text(TOML + 'lengths = "lengths.npy"\n')
    result = invoke("plan", "--config", project / "orch.toml", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["samples"] == 20_000


@pytest.mark.parametrize("content, name, message", [
    ("", "empty.txt", "no lengths"),
    ("5\n-1\n", "neg.txt", "lengths must be >= 0"),
    ("5\n2.5\n", "frac.txt", "expected one integer"),
])
def test_plan_bad_lengths_is_input_error(project, content, name, message):
    (project / name).write_text(content)
    result = invoke("plan", "--lengths", project / name, "--config", project / "orch.toml")
    assert isinstance(result.exception, InputError)
    assert message in result.exception.message and result.exception.hint


def test_plan_budget_below_max_seq_len_is_input_error(project):
    result = invoke("plan", "--lengths", project / "lengths.npy", "--config", project / "orch.toml",
                    "--token-budget", "1024")
    assert isinstance(result.exception, InputError)
    assert "smaller than max_seq_len" in result.exception.message


def test_plan_overlong_error_policy_is_input_error(project):
    (project / "orch.toml").write_text(TOML.replace('overlong = "truncate"', 'overlong = "error"'))
    result = invoke("plan", "--lengths", project / "lengths.npy", "--config", project / "orch.toml")
    assert isinstance(result.exception, InputError)
    assert "longer than max_seq_len" in result.exception.message and "overlong" in result.exception.hint


def test_plan_without_lengths_is_input_error(project):
    result = invoke("plan", "--config", project / "orch.toml")
    assert isinstance(result.exception, InputError) and "--lengths" in result.exception.hint


def test_optimize_writes_buckets_keeping_comments(project):
    result = invoke("optimize", "--buckets", "4", "--lengths", project / "lengths.npy", "--config", project / "orch.toml")
    assert result.exit_code == 0, result.output
    text = (project / "orch.toml").read_text()
    assert "# a comment the optimizer must keep" in text and "# tokens per batch" in text
    import tomllib

    buckets = tomllib.loads(text)["batching"]["buckets"]
    assert len(buckets) == 5 and buckets[0] == 0 and buckets[-1] == 4096
    assert f"buckets = {buckets}" in result.output
    # The written boundaries are what `plan` then shows as the configured bucketing.
    result = invoke("plan", "--lengths", project / "lengths.npy", "--config", project / "orch.toml", "--json")
    assert any(r["name"] == "bucketed K=4 given" and r["config"]["buckets"] == buckets
               for r in json.loads(result.stdout)["rows"])


def test_optimize_no_write_leaves_the_file(project):
    before = (project / "orch.toml").read_text()
    result = invoke("optimize", "--buckets", "3", "--lengths", project / "lengths.npy", "--config",
                    project / "orch.toml", "--no-write")
    assert result.exit_code == 0, result.output
    assert (project / "orch.toml").read_text() == before and "buckets = [0, " in result.output


def test_optimize_without_orch_toml_is_input_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "l.txt").write_text("5\n9\n700\n")
    result = invoke("optimize", "--buckets", "2", "--lengths", tmp_path / "l.txt")
    assert isinstance(result.exception, InputError) and "--no-write" in result.exception.hint


def test_through_orch_main_with_global_config(project):
    from orchestrator.cli.main import app as orch

    runner = CliRunner()
    result = runner.invoke(orch, ["--config", str(project / "orch.toml"), "batching", "plan", "--json",
                                  "--lengths", str(project / "lengths.npy")], prog_name="orch")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["config"]["token_budget"] == 16384
    (project / "empty.txt").write_text("")
    result = runner.invoke(orch, ["--config", str(project / "orch.toml"), "batching", "plan",
                                  "--lengths", str(project / "empty.txt")], prog_name="orch")
    assert result.exit_code == 2
    assert "error:" in result.stderr and "no lengths" in result.stderr and "hint:" in result.stderr


def test_plot_without_matplotlib_is_input_error(project, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)  # import matplotlib -> ImportError
    result = invoke("plan", "--lengths", project / "lengths.npy", "--config", project / "orch.toml",
                    "--plot", project / "plan.png")
    assert isinstance(result.exception, InputError) and "'<orch checkout>[plot]'" in result.exception.hint
    assert not (project / "plan.png").exists()
