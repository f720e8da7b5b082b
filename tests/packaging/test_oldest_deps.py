"""Every lower bound in pyproject.toml is one orch works on: the wheel installed in a fresh venv with the oldest
allowed typer, pydantic and paramiko (read from pyproject.toml, so the test follows the bounds), its
``orch --help``, a command's help, a small deploy on the local target, and an SSH config read through paramiko."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import REPO, tmux_socket
from tests.packaging.test_wheel import _env, _run, wheel  # noqa: F401  (the fixture)

OLDEST = ("typer", "pydantic", "paramiko")


def oldest() -> dict[str, str]:
    """Each of OLDEST's lowest allowed version (``>=X`` or ``==X``) in pyproject.toml's dependencies."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    found = {}
    for dep in deps:
        name = re.match(r"[A-Za-z0-9_.-]+", dep).group(0).lower()
        bound = re.search(r"(?:>=|==)\s*([0-9][^,;\s]*)", dep)
        if name in OLDEST:
            assert bound, f"{dep}: no lower bound"
            found[name] = bound.group(1)
    assert set(found) == set(OLDEST)
    return found


def _release(version: str) -> tuple[int, ...]:
    """``2.6`` and ``2.6.0`` as one release."""
    parts = [int(p) for p in version.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


@pytest.fixture(scope="session")
def oldest_installed(wheel, tmp_path_factory) -> Path:  # noqa: F811
    venv = tmp_path_factory.mktemp("oldest") / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], 120)
    pins = [f"{name}=={version}" for name, version in oldest().items()]
    _run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-compile",
          str(wheel), *pins], 600)
    return venv / "bin"


def test_orch_works_on_the_oldest_allowed_libraries(oldest_installed, tmp_path):
    env = _env(oldest_installed)
    env.update(ORCH_WARM="0", XDG_DATA_HOME=str(tmp_path / "data"))
    versions = _run([str(oldest_installed / "python"), "-c", "import importlib.metadata as m, json; print(json.dumps("
                     f"{{n: m.version(n) for n in {list(OLDEST)}}}))"], 60, env=env).stdout
    # what pip installed is the least pyproject.toml allows
    assert {n: _release(v) for n, v in json.loads(versions).items()} == {n: _release(v) for n, v in oldest().items()}

    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "main.py").write_text("print('step=1 loss=0.5', flush=True)\n")

    def orch(*args: str) -> subprocess.CompletedProcess:
        return _run([str(oldest_installed / "orch"), *args], 120, cwd=proj, env=env)

    assert "Run:" in orch("--help").stdout
    assert "--gpus <N>" in orch("deploy", "--help").stdout
    try:
        orch("init")
        started = json.loads(orch("deploy", "--wait", "60", "--json").stdout)
        assert started["experiment"]["id"] == 1
        shown = json.loads(orch("experiments", "show", "1", "--json").stdout)
        assert shown["command"] == "python3 main.py"
    finally:
        subprocess.run(["tmux", "-L", tmux_socket(str(tmp_path / "data" / "orch" / "local")), "kill-server"],
                       capture_output=True)

    config = tmp_path / "ssh_config"
    (tmp_path / "hosts.conf").write_text("Host gpu1\n    HostName 10.1.2.3\n    Port 2222\n")
    config.write_text(f"Include {tmp_path}/hosts.conf\n")
    code = ("import sys; from orchestrator.reach.transport.sshconfig import Connection, load, lookup\n"
            "hop = Connection('gpu1', lookup(load(sys.argv[1]))); print(hop.host, hop.port)")
    assert _run([str(oldest_installed / "python"), "-c", code, str(config)], 60, env=env).stdout.split() == \
        ["10.1.2.3", "2222"]
