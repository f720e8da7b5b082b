"""[env] read into a spec and named by its inputs, without touching a target."""

from __future__ import annotations

import pytest

from orchestrator.config import Settings
from orchestrator.errors import ConfigError
from orchestrator.launch import envs

FACTS = {"version": "3.11.2", "platform": "linux-x86_64", "glibc": "2.36"}


def _settings(tmp_path, **env) -> Settings:
    settings = Settings.model_validate({"env": env})
    settings._project_dir = tmp_path
    return settings


def test_a_requirements_file_is_the_spec_and_its_lines_name_the_env(tmp_path):
    (tmp_path / "requirements.txt").write_text("# pinned\nsix==1.16.0\n\n--extra-index-url https://x\ntomli>=2\n")
    spec = envs.spec(_settings(tmp_path, requirements="requirements.txt"))
    assert spec["names"] == ["six", "tomli"] and spec["source"] == "requirements.txt"
    same = envs.env_hash(spec, FACTS)
    assert same == envs.env_hash({**spec, "requirements": spec["requirements"] + "# a comment\n"}, FACTS)
    assert same != envs.env_hash(spec, {**FACTS, "version": "3.12.1"})
    assert same != envs.env_hash({**spec, "system_site_packages": True}, FACTS)
    assert same != envs.env_hash({**spec, "requirements": "six==1.15.0\ntomli>=2\n"}, FACTS)


def test_an_index_token_is_never_recorded_and_a_restart_names_the_same_env(tmp_path):
    (tmp_path / "requirements.txt").write_text("--extra-index-url https://me:s3cret@pypi.example/simple\nsix\n")
    spec = envs.spec(_settings(tmp_path, requirements="requirements.txt"))
    launch = type("L", (), {"inputs": type("I", (), {"env": spec})(), "venv": {"hash": "h", "packages": {}}})()
    recorded = envs.record(launch)
    assert "s3cret" not in str(recorded) and "https://***@pypi.example/simple" in recorded["spec"]["requirements"]
    assert envs.env_hash(recorded["spec"], FACTS) == envs.env_hash(spec, FACTS)


def test_pyproject_dependencies_and_no_env(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\ndependencies = ["numpy>=1.26", "six"]\n')
    assert envs.spec(_settings(tmp_path, pyproject=True))["requirements"] == "numpy>=1.26\nsix\n"
    assert envs.spec(_settings(tmp_path)) is None


def test_a_missing_requirements_file_and_two_sources_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="requirements.txt does not exist") as err:
        envs.spec(_settings(tmp_path, requirements="requirements.txt"))
    assert err.value.hint
    with pytest.raises(ValueError, match="name one source of requirements"):
        Settings.model_validate({"env": {"requirements": "r.txt", "pyproject": True}})


def test_platform_tags_for_pip_download():
    tags = envs.platforms(FACTS)
    assert tags[0] == "manylinux_2_36_x86_64" and "manylinux_2_17_x86_64" in tags
    assert "manylinux2014_x86_64" in tags and tags[-1] == "linux_x86_64"
    assert envs.platforms({"platform": "linux-aarch64", "glibc": None}) == ["linux_aarch64"]
