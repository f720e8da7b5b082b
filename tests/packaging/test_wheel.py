"""The wheel is the product: build it, install it in a fresh venv outside the repository, use its ``orch``.

The venv gets orch and its dependencies from the wheel's own metadata (``pip install`` from the package
index), so a file missing from the wheel or a dependency missing from pyproject.toml fails here. The
project folder, the target root and the working directory are all outside the repository, and
``PYTHONPATH`` is cleared, so nothing can be imported from the source tree.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import CONFIG, EXAMPLE, REPO, tmux_socket
from tests.packaging.wheel_build import build_wheel



def _run(argv: list, timeout: float, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    assert proc.returncode == 0, f"{argv} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of the checkout's shipped files."""
    return build_wheel(REPO, tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="session")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh venv holding only the built wheel and its dependencies; its bin/ folder."""
    venv = tmp_path_factory.mktemp("installed") / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], 120)  # this pip installs into it: faster
    _run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-compile",
          str(wheel)], 600)
    return venv / "bin"


def _env(bin_dir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "ORCH_", "VIRTUAL_ENV"))}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"  # as after `source venv/bin/activate`
    return env


def test_the_installed_package_is_the_wheel_not_the_checkout(installed, tmp_path):
    code = ("import orchestrator, importlib.metadata as m, json; "
            "from orchestrator.reach.agent_client import agent_zip; from orchestrator.launch import playbooks; "
            "print(json.dumps([orchestrator.__file__, m.version('orch'), agent_zip()[0], playbooks.builtin_names()]))")
    out = _run([str(installed / "python"), "-c", code], 60, cwd=tmp_path, env=_env(installed)).stdout
    path, version, digest, books = json.loads(out)
    assert Path(path).is_relative_to(installed.parent) and not Path(path).is_relative_to(REPO)
    from orchestrator import __version__
    from orchestrator.reach.agent_client import agent_zip

    assert version == __version__
    assert digest == agent_zip()[0]  # the agent built from the installed files is the checkout's, byte for byte
    assert books == ["deploy", "restart", "stop"]


def test_init_copies_the_shipped_playbooks(installed, tmp_path):
    _run([str(installed / "orch"), "init", "--playbooks"], 60, cwd=tmp_path, env=_env(installed))
    assert (tmp_path / "orch.toml").is_file()
    for name in ("deploy", "restart", "stop"):
        shipped = REPO / "orchestrator" / "launch" / "builtin_playbooks" / f"{name}.yaml"
        assert (tmp_path / "playbooks" / f"{name}.yaml").read_text() == shipped.read_text()


def test_the_installed_orch_runs_a_project_end_to_end(installed, tmp_path):
    proj, root = tmp_path / "proj", tmp_path / "target"
    proj.mkdir()
    shutil.copy(EXAMPLE / "train.py", proj / "train.py")
    (proj / "orch.toml").write_text(CONFIG.format(steps=100000, ckpt_every=10, sleep=0.01, root=root,
                                                  lock_timeout=10) + "gpus = 2\n")  # [targets.local]: 2 GPUs
    env = _env(installed)

    def orch(*args: str) -> subprocess.CompletedProcess:
        return _run([str(installed / "orch"), *args], 120, cwd=proj, env=env)

    try:
        assert orch("--version").stdout.strip() == f"orch {_version(installed)}"
        first = json.loads(orch("deploy", "-m", "from the wheel", "--json").stdout)["experiment"]
        assert first["id"] == 1 and first["status"] == "running"
        status = _wait_for_step(orch)
        assert status["experiment"] == 1 and status["state"] == "running"
        logs = orch("logs", "-n", "5").stdout
        assert "step=" in logs and "loss=" in logs
        second = json.loads(orch("restart", "--json").stdout)
        assert second["experiment"]["id"] == 2 and second["experiment"]["parent"] == 1
        assert [r["id"] for r in second["stopped"]] == [1]
        assert json.loads(orch("status", "--json").stdout)["experiment"] == 2
        stopped = orch("stop")
        assert "2" in stopped.stdout
        final = json.loads(orch("status", "--json").stdout)
        assert final["experiment"] == 2 and final["state"] == "stopped"
        assert json.loads(orch("experiments", "show", "1", "--json").stdout)["status"] == "stopped"

        # side by side: two runs on disjoint GPUs, bare commands acting on the latest
        third = json.loads(orch("deploy", "--gpus", "1", "--json").stdout)["experiment"]
        fourth = json.loads(orch("deploy", "--gpus", "1", "--beside", "--json").stdout)["experiment"]
        assert (third["id"], fourth["id"]) == (3, 4) and fourth["status"] == "running"
        both = orch("status", "--json")
        assert "acting on the latest, experiment 4" in both.stderr, both.stderr
        assert sorted((r["experiment"], r["gpus"][0]) for r in json.loads(both.stdout)["live"]) == [(3, 0), (4, 1)]
        stopped = orch("stop")
        assert "experiment 4 on local: stopped" in stopped.stdout, stopped.stdout
        assert json.loads(orch("experiments", "show", "3", "--json").stdout)["status"] == "running"
        assert "experiment 3 on local: stopped" in orch("stop").stdout
    finally:
        subprocess.run(["tmux", "-L", tmux_socket(str(root)), "kill-server"], capture_output=True)


def _version(installed: Path) -> str:
    code = "import importlib.metadata as m; print(m.version('orch'))"
    return _run([str(installed / "python"), "-c", code], 60).stdout.strip()


def _wait_for_step(orch) -> dict:
    deadline = time.monotonic() + 30
    while True:
        status = json.loads(orch("status", "--json").stdout)
        if (status.get("summary") or {}).get("step") is not None:
            return status
        assert time.monotonic() < deadline, f"the run printed no step: {status}"
        time.sleep(0.3)


def test_an_installed_orch_names_its_warm_process_by_the_installers_record(installed, tmp_path):
    """Installed, the warm socket's name comes from the RECORD the installer wrote (each file's sha256), not from
    stating every file: an install that changed a file (a new RECORD) gets a warm process of its own, the same
    files again the same one. A checkout states its files (test_warm.py changes one)."""
    code = ("import json, os; from orchestrator.warm import client; "
            "pkg = os.path.dirname(os.path.dirname(os.path.realpath(client.__file__))); "
            "print(json.dumps([client.socket_path(), client._record(pkg) is not None]))")

    def name() -> tuple[str, bool]:
        out = _run([str(installed / "python"), "-c", code], 60, cwd=tmp_path, env=_env(installed)).stdout
        path, from_record = json.loads(out)
        return path, from_record

    first, from_record = name()
    assert from_record
    record = next(installed.parent.glob("lib/python*/site-packages/orch-*.dist-info/RECORD"))
    text = record.read_bytes()
    line = next(x for x in text.splitlines() if x.startswith(b"orchestrator/warm/server.py,"))
    try:
        record.write_bytes(text.replace(line, line.replace(b"sha256=", b"sha256=0")))  # a changed file's install
        changed, _ = name()
        assert changed != first
    finally:
        record.write_bytes(text)
    assert name() == (first, True)
    # a checkout's name is made from its files: the checkout's orch has no RECORD beside it
    from orchestrator.warm import client

    assert client._record(str(REPO / "orchestrator")) is None
