"""Reading secrets on the controller: names from orch.toml, values from the environment or a 0600 file."""

from __future__ import annotations

import pytest

from orchestrator.config import load_settings
from orchestrator.errors import ConfigError, InputError
from orchestrator.secrets import collect, looks_secret


def write(path, text: str, mode: int = 0o600):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


def test_the_environment_wins_over_the_file_and_the_repr_hides_values(tmp_path):
    write(tmp_path / "secrets.env", "# a comment\n\nexport A='from file a'\nB = \"from file b\"\nC=c=with=equals\n")
    values = collect(["A", "B", "C"], tmp_path, {"A": "from env"})
    assert values == {"A": "from env", "B": "from file b", "C": "c=with=equals"}
    assert "from" not in repr(values) and "from" not in str(values) and "A" in repr(values)


def test_missing_secrets_are_named_with_both_places(tmp_path):
    with pytest.raises(InputError) as err:
        collect(["HF_TOKEN", "WANDB_API_KEY"], tmp_path, {})
    assert "HF_TOKEN, WANDB_API_KEY" in err.value.message and "environment" in err.value.message
    assert str(tmp_path / "secrets.env") in err.value.message


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660])
def test_a_file_others_may_read_is_refused(tmp_path, mode):
    write(tmp_path / "secrets.env", "A=value-of-a\n", mode)
    with pytest.raises(InputError) as err:
        collect(["A"], tmp_path, {"A": "x"})
    assert "chmod 600" in (err.value.hint or "") and "value-of-a" not in err.value.message


def test_a_symlinked_or_malformed_file_is_refused_without_showing_its_content(tmp_path):
    real = write(tmp_path / "real.env", "A=1\n")
    (tmp_path / "secrets.env").symlink_to(real)
    with pytest.raises(InputError):
        collect(["A"], tmp_path, {})
    (tmp_path / "secrets.env").unlink()
    write(tmp_path / "secrets.env", "A=1\nnot a line with value-xyz\n")
    with pytest.raises(InputError) as err:
        collect(["A"], tmp_path, {})
    assert "line 2" in err.value.message and "value-xyz" not in err.value.message


def test_no_secrets_named_reads_nothing(tmp_path):
    write(tmp_path / "secrets.env", "A=1\n", 0o644)  # not even checked: nothing asks for it
    assert collect([], tmp_path, {}) == {}


def test_secret_looking_env_keys():
    env = {"WANDB_API_KEY": "", "HF_TOKEN": "", "AWS_SECRET": "", "DB_PASSWORD": "", "PASSWORD": "",
           "OMP_NUM_THREADS": "", "KEYS_DIR": "", "TOKENIZER": ""}
    assert looks_secret(env) == ["WANDB_API_KEY", "HF_TOKEN", "AWS_SECRET", "DB_PASSWORD", "PASSWORD"]


def test_secrets_in_orch_toml_are_names(tmp_path):
    path = tmp_path / "orch.toml"
    path.write_text('[project]\nsecrets = ["HF_TOKEN"]\n')
    assert load_settings(path, env={}).project.secrets == ["HF_TOKEN"]
    for bad in ('["HF-TOKEN"]', '["A", "A"]', '["1A"]'):
        path.write_text(f"[project]\nsecrets = {bad}\n")
        with pytest.raises(ConfigError):
            load_settings(path, env={})
    path.write_text('[project]\nsecrets = ["HF_TOKEN"]\nenv = { HF_TOKEN = "x" }\n')
    with pytest.raises(ConfigError) as err:
        load_settings(path, env={})
    assert "HF_TOKEN" in err.value.message and "both" in err.value.message
