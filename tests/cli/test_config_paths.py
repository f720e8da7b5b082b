"""`--config PATH` (and ORCH_CONFIG) naming something that is not a readable orch.toml: an `error:` and a
`hint:`, a non-zero exit, no traceback, and nothing written on the target or in the records."""

from __future__ import annotations

import os

import pytest

from tests.conftest import snapshot


def _refused(project, args: list[str], env: dict | None = None) -> str:
    before = snapshot(project.path, project.root)
    proc = project.run(*args, timeout=30, env=env)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, proc.stderr  # a configuration error's exit code
    assert "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("error: config file "), proc.stderr
    assert lines[1].startswith("hint: "), proc.stderr
    assert proc.stdout == ""
    assert snapshot(project.path, project.root) == before
    assert not (project.path / ".orch").exists() and not project.root.exists()
    return proc.stderr


@pytest.mark.parametrize("path, says", [
    ("/proc/self/mem", "/proc/self/mem cannot be read: Input/output error"),
    ("/dev/zero", "/dev/zero is a device, not a regular file"),
    ("/dev/null", "/dev/null is a device, not a regular file"),
])
def test_a_special_file_as_config_is_refused(project, path, says):
    err = _refused(project, ["--config", path, "status"])
    assert says in err
    assert "hint: pass --config PATH of an orch.toml file" in err


def test_a_folder_as_config_names_the_orch_toml_inside_it(project):
    err = _refused(project, ["--config", str(project.path), "deploy"])
    assert f"error: config file {project.path} is a folder, not a file" in err
    assert f"hint: pass --config {project.path / 'orch.toml'} (the orch.toml inside it)" in err


def test_a_fifo_as_config_is_refused_without_waiting_for_a_writer(project, tmp_path):
    fifo = tmp_path / "orch.fifo"
    os.mkfifo(fifo)
    err = _refused(project, ["--config", str(fifo), "status"])  # reading it would block: the timeout would fail
    assert f"{fifo} is a FIFO, not a regular file" in err


def test_a_config_far_larger_than_any_orch_toml_is_refused(project, tmp_path):
    big = tmp_path / "big.toml"
    big.write_text("# padding\n" * 120_000)  # valid TOML, 1.2 MB
    err = _refused(project, ["--config", str(big), "experiments", "list"])
    assert "is larger than 1 MiB: not an orch.toml" in err


def test_orch_config_naming_a_folder_says_so_and_how_to_set_it(project):
    err = _refused(project, ["status"], env={"ORCH_CONFIG": str(project.path)})
    assert f"{project.path} (named by ORCH_CONFIG) is a folder, not a file" in err
    assert f"hint: set ORCH_CONFIG={project.path / 'orch.toml'}" in err


def test_a_missing_config_still_says_it_does_not_exist(project, tmp_path):
    err = _refused(project, ["--config", str(tmp_path / "nowhere.toml"), "status"])
    assert f"config file {tmp_path / 'nowhere.toml'} does not exist" in err
