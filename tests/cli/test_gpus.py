"""orch gpus and deploy/restart --gpus on the local target, with the nvidia-smi stand-in first on PATH.

The runs are real (tmux, the agent, the registry); the GPU processes nvidia-smi reports are real pids:
a child of a run's recorded command, and a process orch did not start.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from tests.testbed import gpu_standin
from tests.testbed.gpu_standin import gpu_state, gpu_uuid
from tests.waits import wait_for

COMMAND = 'echo "visible=$CUDA_VISIBLE_DEVICES"; sleep 300 & wait'


@pytest.fixture
def gpu_project(project, tmp_path):
    text = (project.path / "orch.toml").read_text().replace('command = "python3 train.py"',
                                                              f"command = {json.dumps(COMMAND)}")
    (project.path / "orch.toml").write_text(text)
    project.smi = tmp_path / "smi"
    project.env = gpu_standin.install_local(project.smi, gpu_state(2, seed=9))
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    project.stranger = stranger.pid
    yield project
    project.run("stop", env=project.env)
    stranger.kill()
    stranger.wait()


def _state(project, apps: dict) -> None:
    gpu_standin.install_local(project.smi, gpu_state(2, seed=9, apps=apps))


def _child_of_run(project, exp_id: int) -> int:
    deadline = time.monotonic() + 20
    while True:
        try:
            pid = json.loads((project.run_dir(exp_id) / "pid.json").read_text())["child"]
            kids = open(f"/proc/{pid}/task/{pid}/children").read().split()
        except (OSError, KeyError, ValueError):
            kids = []
        if kids:
            return int(kids[0])
        assert time.monotonic() < deadline, "the run's command has no child"
        time.sleep(0.1)


def _log(project, exp_id: int) -> str:
    def seen() -> str:
        text = (project.run_dir(exp_id) / "train.log").read_text(errors="replace")
        return text if "visible=" in text else ""

    return wait_for(seen, 20, "the run's visible= line")


def test_gpus_names_free_orchs_and_strangers_gpus(gpu_project):
    p = gpu_project
    res = p.run("deploy", env=p.env)
    assert res.returncode == 0, res.stderr
    _state(p, {0: [_child_of_run(p, 1)], 1: [p.stranger]})
    res = p.run("gpus", env=p.env)
    assert res.returncode == 0, res.stderr
    assert "exp 1 (tinylm)" in res.stdout and f"busy: pid {p.stranger}, not orch's" in res.stdout, res.stdout
    data = json.loads(p.run("gpus", "--json", env=p.env).stdout)
    assert [m["target"] for m in data] == ["local"]
    assert [(g["index"], g["uuid"], g["use"]) for g in data[0]["gpus"]] == [
        (0, gpu_uuid(9, 0), "exp 1 (tinylm)"), (1, gpu_uuid(9, 1), f"busy: pid {p.stranger}, not orch's")]
    _state(p, {})
    assert [g["use"] for g in json.loads(p.run("gpus", "--json", env=p.env).stdout)[0]["gpus"]] == ["free", "free"]


def test_gpus_shows_what_nvidia_smi_says_when_it_fails(gpu_project):
    p = gpu_project
    gpu_standin.install_local(p.smi, gpu_state(2, library_version="550.144.03"))
    res = p.run("gpus", env=p.env)
    assert res.returncode == 0, res.stderr
    assert "Failed to initialize NVML: Driver/library version mismatch" in res.stdout, res.stdout
    data = json.loads(p.run("gpus", "--json", env=p.env).stdout)
    assert data[0]["gpus"] == [] and data[0]["error"].startswith("Failed to initialize NVML")
    gpu_standin.install_local(p.smi, None)
    res = p.run("gpus", env=p.env)
    assert "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver" in res.stdout, res.stdout


def test_deploy_gpus_on_one_machine_takes_the_free_ones_and_restart_frees_its_own(gpu_project):
    p = gpu_project
    _state(p, {0: [p.stranger]})
    res = p.run("deploy", "--gpus", "1", env=p.env)
    assert res.returncode == 0, res.stderr
    assert "placement: local: 1 of 2 GPUs free; the run gets GPU 1" in res.stderr, res.stderr
    assert "visible=1" in _log(p, 1).splitlines()
    with p.registry() as reg:
        assert reg.get(1).gpus == [{"index": 1, "uuid": gpu_uuid(9, 1)}]
    _state(p, {1: [_child_of_run(p, 1)]})
    status = p.run("status", env=p.env)
    assert "gpu 1 NVIDIA H100 80GB HBM3: 87% busy, 1024/81559 MiB (the run's)" in status.stdout, status.stdout
    assert "gpu 0" not in status.stdout

    # the run's own GPU counts: restart stops it before the new run starts
    res = p.run("restart", "--gpus", "2", env=p.env)
    assert res.returncode == 0, res.stderr
    assert ("placement: local: 1 of 2 GPUs free, and exp 1 (tinylm) of this project holds the rest: this launch "
            "stops it first; the run gets GPUs 0,1") in res.stderr, res.stderr
    assert "visible=0,1" in _log(p, 2).splitlines()
    with p.registry() as reg:
        assert reg.get(1).status == "stopped" and [g["index"] for g in reg.get(2).gpus] == [0, 1]


def test_deploy_refused_when_no_machine_has_n_free_leaves_the_run_running(gpu_project):
    p = gpu_project
    assert p.run("deploy", "--gpus", "1", env=p.env).returncode == 0
    _state(p, {0: [_child_of_run(p, 1)], 1: [p.stranger]})
    res = p.run("deploy", "--gpus", "2", env=p.env)
    assert res.returncode == 5, res.stderr
    assert (f"error: no 2 free GPUs on the machine: local: 0 of 2 free (GPU 0: exp 1 (tinylm); GPU 1: busy: pid "
            f"{p.stranger}, not orch's)") in res.stderr, res.stderr
    assert "hint: " in res.stderr
    with p.registry() as reg:
        assert [(e.id, e.status) for e in reg.list()] == [(1, "running")]
    assert json.loads(p.run("status", "--json", env=p.env).stdout)["state"] == "running"


def test_pool_flags_and_settings_are_checked_before_anything_runs(gpu_project):
    p = gpu_project
    res = p.run("deploy", "--pool", "big", env=p.env)
    assert res.returncode == 2 and "error: --pool chooses a machine by its free GPUs" in res.stderr, res.stderr
    res = p.run("deploy", "--pool", "big", "--gpus", "1", env=p.env)
    assert res.returncode == 2 and "error: no pool 'big' in orch.toml" in res.stderr, res.stderr
    assert "hint: add [pools.big] members" in res.stderr
    p.configure(extra='\n[pools.big]\nmembers = ["local", "gpu9"]\n')
    res = p.run("deploy", "--pool", "big", "--gpus", "1", env=p.env)
    assert res.returncode == 2 and "pools.big.members: gpu9 is not a single target" in res.stderr, res.stderr
    p.configure(extra='\n[pools.big]\nmembers = ["local"]\n')
    res = p.run("deploy", "--pool", "big", "--gpus", "1", env=p.env)
    assert res.returncode == 0 and "placement: local: 2 of 2 GPUs free; the run gets GPU 0" in res.stderr, res.stderr
    with p.registry() as reg:
        assert [e.gpus for e in reg.list()] == [[{"index": 0, "uuid": gpu_uuid(9, 0)}]]


def test_status_flags_idle_gpus_and_compare_shows_their_use(gpu_project):
    p = gpu_project
    p.configure(extra="\n[metrics]\ngpu_idle_after = 1\n")
    text = (p.path / "orch.toml").read_text().replace('command = "python3 train.py"',
                                                       f"command = {json.dumps(COMMAND)}")
    (p.path / "orch.toml").write_text(text)
    assert p.run("deploy", "--gpus", "1", env=p.env).returncode == 0
    first = p.run("status", env=p.env)
    assert "input-bound?" not in first.stdout, first.stdout
    time.sleep(1.5)
    second = p.run("status", env=p.env)
    assert re.search(r"^  ! GPU 0 at 0% for \d+ s: input-bound\?$", second.stdout, re.M), second.stdout
    with p.registry() as reg:
        series = reg.get(1).gpu_series
    assert len(series) == 1 and series[0][1] == [[0.0, 0.0]]

    _state(p, {1: [p.stranger]})
    assert p.run("deploy", "--gpus", "1", env=p.env).returncode == 0
    compared = json.loads(p.run("experiments", "compare", "1", "2", "--json", env=p.env).stdout)
    rows = {m["metric"]: m["values"] for m in compared["metrics"]}
    assert rows["gpus"] == ["0", "0"] and rows["gpu util"] == ["0%", "-"] and rows["gpu memory peak"] == ["0 MiB", "-"]


def test_a_machine_that_does_not_answer_shows_as_such(gpu_project):
    p = gpu_project
    p.configure(extra="\n[ssh]\nread_timeout = 2\n")
    gpu_standin.install_local(p.smi, gpu_state(2, delay_s=20))
    res = p.run("gpus", env=p.env)
    assert res.returncode == 0, res.stderr
    assert "did not finish within 2 s on the local target" in res.stdout, res.stdout
    data = json.loads(p.run("gpus", "--json", env=p.env).stdout)
    assert data[0]["gpus"] == [] and "within 2 s" in data[0]["error"]
