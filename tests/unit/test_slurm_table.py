"""``[slurm]``: the options of every Slurm target's jobs in one table, a target's own keys winning; bad values
refused with the file, the key and what is allowed."""

from __future__ import annotations

import pytest

from orchestrator.config import load_settings
from orchestrator.errors import ConfigError
from orchestrator.launch.slurm import job_spec
from orchestrator.reach.targets import planned_target, target_spec

TABLE = """\
[slurm]
partition = "gpu"
account = "ml"
time = "1-00:00:00"
signal = "INT@120"
resubmit = true
sbatch_args = ["--mem=32G"]

[targets.lab]
kind = "slurm"
host = "login.lab"

[targets.short]
kind = "slurm"
host = "login.lab"
partition = "short"
time = "30:00"
resubmit = false
sbatch_args = ["--exclusive"]
"""


def _spec(tmp_path, text: str, name: str) -> dict:
    (tmp_path / "orch.toml").write_text(text)
    settings = load_settings(tmp_path / "orch.toml", env={})
    return job_spec(planned_target(settings, *target_spec(settings, name)), "p", 3, None)


def test_a_slurm_target_takes_the_tables_options(tmp_path) -> None:
    assert _spec(tmp_path, TABLE, "lab") == {
        "name": "orch-p-3", "partition": "gpu", "account": "ml", "time": "1-00:00:00", "signal": "INT@120",
        "resubmit": True, "sbatch_args": ["--mem=32G"]}


def test_a_targets_own_keys_win_over_the_table(tmp_path) -> None:
    # what it sets is its own (resubmit = false too); what it leaves out comes from [slurm]
    assert _spec(tmp_path, TABLE, "short") == {
        "name": "orch-p-3", "partition": "short", "account": "ml", "time": "30:00", "signal": "INT@120",
        "sbatch_args": ["--exclusive"]}


def test_the_table_can_be_set_from_the_command_line(tmp_path) -> None:
    (tmp_path / "orch.toml").write_text('[targets.lab]\nkind = "slurm"\nhost = "login.lab"\n')
    settings = load_settings(tmp_path / "orch.toml", env={"ORCH_SLURM__QOS": "high"},
                             overrides=["slurm.resubmit=true"])
    spec = job_spec(planned_target(settings, *target_spec(settings, "lab")), "p", None, None)
    assert spec == {"name": "orch-p", "qos": "high", "resubmit": True}


@pytest.mark.parametrize("line, says", [
    ('time = "2 days"', "slurm.time = '2 days': is not a Slurm time limit"),
    ('signal = "USR1@60"', 'slurm.signal = \'USR1@60\': must be "INT@<seconds>" or "TERM@<seconds>"'),
    ('signal = "INT"', 'slurm.signal = \'INT\': must be "INT@<seconds>"'),
    ('sbatch_args = ["gpu"]', "'gpu' is not an sbatch option"),
    ('sbatch_args = ["--output=/tmp/x"]', "--output is set by orch for every job"),
    ('resubmit = "maybe"', "slurm.resubmit = 'maybe'"),
    ('partitions = "gpu"', "unknown key 'slurm.partitions' (allowed here: account, partition, qos, resubmit, "
                           "sbatch_args, signal, time)"),
])
def test_a_bad_slurm_table_is_refused_naming_the_file_and_key(tmp_path, line: str, says: str) -> None:
    (tmp_path / "orch.toml").write_text(f"[slurm]\n{line}\n")
    with pytest.raises(ConfigError) as refused:
        load_settings(tmp_path / "orch.toml", env={})
    assert says in refused.value.message and "orch.toml" in refused.value.message, refused.value.message


def test_a_targets_bad_time_is_refused_too(tmp_path) -> None:
    (tmp_path / "orch.toml").write_text('[targets.lab]\nkind = "slurm"\nhost = "h"\ntime = "soon"\n')
    with pytest.raises(ConfigError) as refused:
        load_settings(tmp_path / "orch.toml", env={})
    assert "targets.lab.time = 'soon': is not a Slurm time limit" in refused.value.message
