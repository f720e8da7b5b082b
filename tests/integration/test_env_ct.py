"""The run's environment ([env]) on the testbed CTs, which reach nothing beyond their bridge: the wheels are resolved
and downloaded on this machine, pushed as blobs, and installed in the CT with no index; a job's nodes share the
env's hash; a build cut by a killed connection is never used, and the next deploy completes it."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.cli.test_env import download_wheels
from tests.conftest import wait_for
from tests.integration.test_multinode_ct import _job_project, _on_host, _until
from tests.integration.test_remote import ROOT, on_ct, remote  # noqa: F401  (the fixture)

pytestmark = pytest.mark.testbed

TRAIN = """\
import os, shutil, time
import six, tomli
print(f"six={six.__version__} tomli={tomli.__name__} python={shutil.which('python3')}", flush=True)
time.sleep(float(os.environ.get("ENV_SLEEP", "0")))
"""
ENV = '\n[env]\nrequirements = "requirements.txt"\n'


@pytest.fixture(scope="module")
def wheels_folder(tmp_path_factory):
    return download_wheels(tmp_path_factory.mktemp("wheels"), ("six", "tomli"))  # whichever versions the index has


def _versions(folder) -> dict:
    """``{"six": "1.17.0", "tomli": "2.2.1"}``, from the wheels' file names."""
    return {p.name.split("-")[0]: p.name.split("-")[1] for p in folder.glob("*.whl")}


@pytest.fixture(autouse=True)
def _offline(tmp_path, monkeypatch, wheels_folder):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the wheels orch downloads: this test's own
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels_folder))


def _project(remote, extra: str = "", sleep: float = 0) -> None:  # noqa: F811
    (remote.path / "requirements.txt").write_text("six\ntomli\n")
    _job_project(remote, "python3 env_train.py", f'OMP_NUM_THREADS = "1", ENV_SLEEP = "{sleep}"',
                 extra=ENV + extra + '\n[distributed]\nlauncher = "none"\n', script=_script(remote))


def _script(remote):  # noqa: F811
    path = remote.path.parent / "env_train.py"
    path.write_text(TRAIN)
    return path


def _envs(testbed, vmid: int) -> list[str]:
    folder = _on_host(testbed, vmid, f"{ROOT}/envs")
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) if folder.is_dir() else []


def test_pushed_wheels_on_a_ct_without_network_and_a_code_change_builds_nothing(remote, testbed,  # noqa: F811
                                                                                wheels_folder):
    _project(remote)
    versions = _versions(wheels_folder)
    dry = remote.run("deploy", "--ct", "200", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "build_env: build the environment of requirements.txt (2 requirements" in dry.stdout
    res = remote.run("deploy", "--ct", "200", "--wait=30", timeout=600)
    assert res.returncode == 0, res.stderr
    assert "building the environment" in res.stderr and "2 wheels pushed" in res.stderr  # no index from the CT
    (env_hash,) = _envs(testbed, 200)
    run_dir = f"{ROOT}/runs/{remote.run_key(1)}"
    log = on_ct(testbed, 200, "cat", f"{run_dir}/train.log")
    assert f"six={versions['six']} tomli=tomli python={ROOT}/envs/{env_hash}/bin/python3" in log, log
    exp = remote.registry().get(1)
    assert exp.env["hash"] == env_hash and exp.env["packages"] == versions

    (remote.path / "env_train.py").write_text(TRAIN + "# a code change only\n")
    again = remote.run("deploy", "--ct", "200", "--wait=30", timeout=300)
    assert again.returncode == 0, again.stderr
    assert "building the environment" not in again.stderr
    assert remote.registry().get(2).env["hash"] == env_hash and _envs(testbed, 200) == [env_hash]


def test_a_job_s_nodes_use_the_same_env(remote, testbed):  # noqa: F811
    _project(remote)
    res = remote.run("deploy", "--ct", "200", "--ct", "201", timeout=600)
    assert res.returncode == 0, res.stderr
    data = _until(remote, ("finished", "crashed"), 120)
    assert [(n["state"], n["exit_code"]) for n in data["nodes"]] == [("finished", 0), ("finished", 0)], data
    exp = remote.registry().get(1)
    hashes = [n["env"] for n in exp.nodes]
    assert hashes[0] == hashes[1] == exp.env["hash"]
    for vmid, node in zip((200, 201), exp.nodes):
        assert _envs(testbed, vmid) == [exp.env["hash"]]
        launch = json.loads(on_ct(testbed, vmid, "cat", f"{node['run_dir']}/launch.json"))
        assert launch["env"]["VIRTUAL_ENV"] == f"{ROOT}/envs/{exp.env['hash']}"
        assert "six=" in on_ct(testbed, vmid, "cat", f"{node['run_dir']}/train.log")


def test_a_build_cut_by_a_killed_connection_is_completed_by_the_next_deploy(remote, testbed):  # noqa: F811
    proxy = testbed.proxy("10.77.0.200", 22)
    host_key = testbed.ct(200).host_key_line.split(" ", 1)[1]
    remote.known_hosts.write_text(remote.known_hosts.read_text() + f"[127.0.0.1]:{proxy.port} {host_key}\n")
    # venv + pip (no uv): a build of seconds, to cut into
    _project(remote, extra=f'installer = "pip"\n\n[targets.cut]\nkind = "proxmox"\nct = 200\naddress = "127.0.0.1"\n'
                           f'port = {proxy.port}\n')
    deploy = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "deploy", "--target", "cut"],
                              cwd=remote.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    store = _on_host(testbed, 200, f"{ROOT}/envs/.store")
    wait_for(lambda: store.is_dir() and any((d / "build.json").exists() for d in store.iterdir()), timeout=300,
             what="the build to start in the CT")
    proxy.kill()
    _out, err = deploy.communicate(timeout=120)
    assert deploy.returncode != 0, err
    assert "half-built environment is never used" in err.decode(), err
    assert not remote.registry().list()  # the build comes before the record: nothing to settle
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # however the cut build ends, no link names an env that is not complete
        for name in _envs(testbed, 200):
            assert _on_host(testbed, 200, f"{ROOT}/envs/{name}/orch-env.json").exists()
        time.sleep(0.2)

    res = remote.run("deploy", "--target", "cut", "--wait=30", timeout=600)
    assert res.returncode == 0, res.stderr
    (env_hash,) = _envs(testbed, 200)
    assert len(list(store.iterdir())) == 1  # the cut build's leftover went
    exp = remote.registry().get(1)
    assert exp.env["hash"] == env_hash
    log = on_ct(testbed, 200, "cat", f"{ROOT}/runs/{remote.run_key(1)}/train.log")
    assert "six=" in log and "tomli=tomli" in log, log
