"""orch deploy --gpus N --beside on the local target with ``[targets.local] gpus = 2``: runs side by side.

Real runs (tmux, the agent, the registry): each prints the GPUs and checkpoint folder it was given and
writes a checkpoint there, so what a run saw is read from its own log and folder.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import Project, snapshot, tmux_socket, wait_for

TRAIN = """\
import os, signal, sys, time
ckpt = os.environ["ORCH_CHECKPOINT_DIR"]
print(f"visible={os.environ.get('CUDA_VISIBLE_DEVICES')} ckpt={ckpt}", flush=True)
os.makedirs(ckpt, exist_ok=True)
with open(os.path.join(ckpt, f"ckpt-exp{os.environ['ORCH_EXPERIMENT_ID']}.pt"), "w") as fh:
    fh.write("weights")
signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
while True:
    print("step=1 loss=1.0", flush=True)
    time.sleep(0.5)
"""


@pytest.fixture
def side(project):
    (project.path / "train.py").write_text(TRAIN)
    project.configure(extra="gpus = 2\n")  # in [targets.local]: a machine whose GPUs nvidia-smi does not show
    yield project
    project.run("stop", "--all")


def _printed(project, exp_id: int) -> dict:
    """What experiment ``exp_id``'s script printed of its GPUs and checkpoint folder."""
    log = project.run_dir(exp_id) / "train.log"
    line = wait_for(lambda: next((ln for ln in log.read_text(errors="replace").splitlines()
                                  if ln.startswith("visible=")), None) if log.exists() else None,
                    what=f"experiment {exp_id}'s first line", timeout=90)  # a queued start under load
    return dict(part.split("=", 1) for part in line.split())


def _states(project) -> dict[int, str]:
    with project.registry() as reg:
        return {e.id: e.status for e in reg.list()}


def test_two_side_by_side_on_disjoint_gpus_and_a_third_refused(side):
    p = side
    res = p.run("deploy", "--gpus", "1")
    assert res.returncode == 0, res.stderr
    res = p.run("deploy", "--gpus", "1", "--beside")
    assert res.returncode == 0, res.stderr
    assert "placement: local: GPU 0: experiment 1 (tinylm); GPU 1: free; the run gets GPU 1, beside the running " \
           "experiments (none is stopped)" in res.stderr, res.stderr
    assert _states(p) == {1: "running", 2: "running"}
    first, second = _printed(p, 1), _printed(p, 2)
    own = p.checkpoints.with_name(f"{p.checkpoints.name}@exp2")  # beside the lineage's folder, not in it
    wait_for(lambda: (own / "ckpt-exp2.pt").exists(), what="experiment 2's checkpoint")
    assert first == {"visible": "0", "ckpt": str(p.checkpoints)}
    assert second == {"visible": "1", "ckpt": f"{p.checkpoints}@exp2"}
    assert (p.checkpoints / "ckpt-exp1.pt").exists() and (own / "ckpt-exp2.pt").exists()
    assert not (p.checkpoints / "ckpt-exp2.pt").exists()
    # each has its own window in the project's one session
    windows = subprocess.run(["tmux", "-L", tmux_socket(str(p.root)), "list-windows", "-t", "orch-tinylm", "-F",
                              "#{window_name}"], capture_output=True, text=True).stdout.split()
    assert sorted(windows) == ["exp1", "exp2"]

    before = (sorted(x.name for x in (p.root / "runs").iterdir()), snapshot(p.checkpoints))
    res = p.run("deploy", "--gpus", "1", "--beside")
    assert res.returncode == 5, res.stderr
    assert "error: no 1 free GPU on local beside the running experiments: GPU 0: experiment 1 (tinylm); GPU 1: " \
           "experiment 2 (tinylm)" in res.stderr, res.stderr
    assert "hint: queue it with --queue (it starts when GPUs free up), or free them: orch stop -e 1" in res.stderr
    assert _states(p) == {1: "running", 2: "running"}
    assert (sorted(x.name for x in (p.root / "runs").iterdir()), snapshot(p.checkpoints)) == before

    # under the lock, the start check refuses GPUs a live run was given since the launch looked
    from orchestrator.agent.run import start_check
    from orchestrator.agent.layout import Layout
    from orchestrator.agent.protocol import AgentFailure

    with pytest.raises(AgentFailure) as refused:
        start_check.check(Layout(str(p.root)), 9, "tinylm", "r-any", stops_runs=False, revision_pending=True,
                          beside="1")
    assert refused.value.kind == "conflict" and "GPU 1 is taken by experiment 2 (tinylm)" in refused.value.message


def test_beside_needs_gpus(side):
    res = side.run("deploy", "--beside")
    assert res.returncode == 2, res.stderr
    assert "error: --beside places the new run on GPUs no running experiment holds" in res.stderr
    assert "hint: give --gpus N with --beside" in res.stderr
    with side.registry() as reg:
        assert reg.list() == []


def test_status_lists_both_and_bare_logs_and_stop_act_on_the_latest(side):
    p = side
    assert p.run("deploy", "--gpus", "1").returncode == 0
    assert p.run("deploy", "--gpus", "1", "--beside").returncode == 0
    _printed(p, 1), _printed(p, 2)
    note = "orch: 2 runs of tinylm here; acting on the latest, experiment 2 (-e ID names another)"

    res = p.run("status", "--no-metrics")
    assert res.returncode == 0, res.stderr
    assert note in res.stderr, res.stderr
    assert "local: experiment 2 running" in res.stdout, res.stdout
    assert "2 runs side by side here:" in res.stdout
    assert f"experiment 2 running on GPU 1, revision" in res.stdout
    assert f"checkpoints {p.checkpoints}@exp2" in res.stdout, res.stdout
    assert f"experiment 1 running on GPU 0, revision" in res.stdout
    data = json.loads(p.run("status", "--json", "--no-metrics").stdout)
    assert data["experiment"] == 2 and [(r["experiment"], r["gpus"]) for r in data["live"]] == [(2, [1]), (1, [0])]
    one = p.run("status", "-e", "1", "--json", "--no-metrics")
    assert one.returncode == 0 and note not in one.stderr, one.stderr
    assert json.loads(one.stdout)["experiment"] == 1

    res = p.run("logs", "-n", "50")
    assert res.returncode == 0 and note in res.stderr, res.stderr
    assert "visible=1 " in res.stdout and "visible=0 " not in res.stdout, res.stdout
    res = p.run("logs", "-e", "1", "-n", "50")
    assert "visible=0 " in res.stdout and note not in res.stderr, res.stderr

    dry = p.run("stop", "--dry-run")  # says what the bare stop below does: the latest alone
    assert dry.returncode == 0 and note in dry.stderr, dry.stderr
    assert "stop experiment 2 on the target, and no other run" in dry.stdout, dry.stdout
    assert "would stop: experiment 2\n" in dry.stdout, dry.stdout
    dry = p.run("stop", "--dry-run", "-e", "1")
    assert "stop experiment 1 on the target" in dry.stdout and "would stop: experiment 1\n" in dry.stdout, dry.stdout
    assert _states(p) == {1: "running", 2: "running"}
    res = p.run("stop")
    assert res.returncode == 0, res.stderr
    assert note in res.stderr, res.stderr
    assert "experiment 2 on local: stopped" in res.stdout, res.stdout
    assert _states(p) == {1: "running", 2: "stopped"}
    res = p.run("status", "--no-metrics")
    assert "runs of tinylm here" not in res.stderr and "side by side" not in res.stdout, res.stdout
    res = p.run("stop")  # one left: a bare stop stops it, as always
    assert res.returncode == 0 and "acting on" not in res.stderr, res.stderr
    assert _states(p) == {1: "stopped", 2: "stopped"}


def test_stop_all_stops_every_run_side_by_side_and_empties_the_queue(side):
    p = side
    assert p.run("deploy", "--gpus", "1").returncode == 0
    assert p.run("deploy", "--gpus", "1", "--beside").returncode == 0
    _printed(p, 1), _printed(p, 2)
    assert p.run("deploy", "--gpus", "1", "--beside", "--queue").returncode == 0
    dry = p.run("stop", "--all", "--dry-run")
    assert dry.returncode == 0 and "acting on the latest" not in dry.stderr, dry.stderr
    assert "would stop: experiment 1, experiment 2\n" in dry.stdout, dry.stdout
    res = p.run("stop", "--all")
    assert res.returncode == 0, res.stderr
    assert "removed from the queue on local: experiment 3" in res.stdout, res.stdout
    assert "experiment 1 on local: stopped" in res.stdout and "experiment 2 on local: stopped" in res.stdout
    assert _states(p) == {1: "stopped", 2: "stopped", 3: "stopped"}  # 3 never started: taken off the queue
    assert not json.loads(p.run("status", "--json", "--no-metrics").stdout).get("live")


def test_a_third_queued_beside_starts_on_the_gpu_freed_by_stop_e(side):
    p = side
    assert p.run("deploy", "--gpus", "1").returncode == 0
    assert p.run("deploy", "--gpus", "1", "--beside").returncode == 0
    _printed(p, 1), _printed(p, 2)
    res = p.run("deploy", "--gpus", "1", "--beside", "--queue")
    assert res.returncode == 0, res.stderr
    assert "placement: local: no 1 free GPU (GPU 0: experiment 1 (tinylm); GPU 1: experiment 2 (tinylm)); queued" \
        in res.stderr, res.stderr
    assert "experiment 3: queued on local at position 1" in res.stdout, res.stdout
    assert _states(p) == {1: "running", 2: "running", 3: "queued"}

    res = p.run("stop", "-e", "1")
    assert res.returncode == 0, res.stderr
    assert "experiment 1 on local: stopped" in res.stdout and "acting on" not in res.stderr, res.stdout
    # the target's queue starts it, with no orch command: read from what its script printed
    third = _printed(p, 3)
    assert third == {"visible": "0", "ckpt": f"{p.checkpoints}@exp3"}
    assert json.loads((p.run_dir(3) / "experiment.json").read_text())["gpus"] == [{"index": 0, "uuid": None}]
    assert _printed(p, 2)["visible"] == "1"
    data = json.loads(p.run("status", "--json", "--no-metrics").stdout)
    assert [(r["experiment"], r["state"], r["gpus"]) for r in data["live"]] == [(3, "running", [0]),
                                                                                 (2, "running", [1])]


def test_another_projects_run_queued_beside_starts_on_the_gpus_a_run_frees(side, tmp_path):
    p = side
    other = Project(tmp_path / "other", p.root)  # a second project on the same machine
    other.path.mkdir()
    (other.path / "train.py").write_text(TRAIN)
    other.configure(extra="gpus = 2\n")
    toml = other.path / "orch.toml"
    toml.write_text(toml.read_text().replace('name = "tinylm"', 'name = "other"'))
    assert p.run("deploy", "--gpus", "2").returncode == 0
    res = other.run("deploy", "--gpus", "1", "--beside", "--queue")
    assert res.returncode == 0, res.stderr
    assert "experiment 1: queued on local at position 1" in res.stdout, res.stdout

    assert p.run("stop").returncode == 0  # tinylm's run ends: other's queued run starts, with no orch command
    assert _printed(other, 1)["visible"] in ("0", "1")
    res = other.run("status", "--no-metrics")
    assert "local: experiment 1 running" in res.stdout, res.stdout
    other.run("stop", "--all")


def test_a_plain_deploy_replaces_every_run_of_the_project(side):
    p = side
    assert p.run("deploy", "--gpus", "1").returncode == 0
    assert p.run("deploy", "--gpus", "1", "--beside").returncode == 0
    dry = p.run("deploy", "--dry-run")
    assert "stop this project's running experiments on the target, all of them when several run side by side" \
        in dry.stdout, dry.stdout
    assert "would stop: experiment 1, experiment 2" in dry.stdout or "would stop: experiment 2, experiment 1" \
        in dry.stdout, dry.stdout
    res = p.run("deploy", "--gpus", "2")
    assert res.returncode == 0, res.stderr
    assert _states(p) == {1: "stopped", 2: "stopped", 3: "running"}
    assert _printed(p, 3) == {"visible": "0,1", "ckpt": str(p.checkpoints)}


def test_beside_refuses_what_it_cannot_carry_before_anything_runs(side):
    p = side
    for flags, said in ((("--guard",), "error: --guard watches a run against the one it replaces"),
                        (("--clean-checkpoints",), "error: --beside runs next to experiments"),
                        (("--ct", "201", "--ct", "202"), "error: --beside starts one run next to the running ones")):
        res = p.run("deploy", "--gpus", "1", "--beside", *flags)
        assert res.returncode == 2 and said in res.stderr, res.stderr
        assert "hint: " in res.stderr
    with p.registry() as reg:
        assert reg.list() == []


def test_restart_beside_relaunches_the_latest_next_to_it(side):
    p = side
    assert p.run("deploy", "--gpus", "1", "-m", "first").returncode == 0
    res = p.run("restart", "--gpus", "1", "--beside")
    assert res.returncode == 0, res.stderr
    assert "the run gets GPU 1, beside the running experiments (none is stopped)" in res.stderr, res.stderr
    assert _states(p) == {1: "running", 2: "running"}
    assert _printed(p, 2) == {"visible": "1", "ckpt": f"{p.checkpoints}@exp2"}
    with p.registry() as reg:
        assert reg.get(2).parent == 1 and reg.get(2).revision == reg.get(1).revision
    res = p.run("restart", "--beside")
    assert res.returncode == 2 and "hint: give --gpus N with --beside" in res.stderr, res.stderr


def test_a_gpu_nvidia_smi_shows_busy_is_not_given(project, tmp_path):
    """No configured count: the machine's GPUs are nvidia-smi's (the stand-in), and one a process orch did not
    start is using counts as taken."""
    import sys

    from tests.testbed import gpu_standin
    from tests.testbed.gpu_standin import gpu_state, gpu_uuid

    (project.path / "train.py").write_text(TRAIN)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    env = gpu_standin.install_local(tmp_path / "smi", gpu_state(2, seed=9, apps={0: [stranger.pid]}))
    try:
        res = project.run("deploy", "--gpus", "1", "--beside", env=env)
        assert res.returncode == 0, res.stderr
        assert f"GPU 0: pid {stranger.pid}, not orch's; GPU 1: free; the run gets GPU 1" in res.stderr, res.stderr
        assert _printed(project, 1)["visible"] == "1"
        with project.registry() as reg:
            assert reg.get(1).gpus == [{"index": 1, "uuid": gpu_uuid(9, 1)}]
        res = project.run("deploy", "--gpus", "1", "--beside", env=env)
        assert res.returncode == 5, res.stderr
        assert f"GPU 0: pid {stranger.pid}, not orch's; GPU 1: experiment 1 (tinylm)" in res.stderr, res.stderr
        assert "orch stop -e 1" in res.stderr
    finally:
        project.run("stop", env=env)
        stranger.kill()
        stranger.wait()


STEPPING = """\
import os, signal, sys, time
print(f"visible={os.environ.get('CUDA_VISIBLE_DEVICES')} ckpt={os.environ['ORCH_CHECKPOINT_DIR']}", flush=True)
signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
step = 0
while True:
    step += 1
    print(f"step={step} loss=1.0", flush=True)
    time.sleep(SLOW)
"""
# a sweep's variants differ by their batching strategy: shuffle's steps are the slow ones
STEPPING = STEPPING.replace("step = 0\n", "import json\nSLOW = 0.8 if json.load(open(os.environ['ORCH_BATCHING_FILE']))"
                            ".get('strategy') == 'shuffle' else 0.1\nstep = 0\n")


def _started_at(project, exp_id: int) -> float:
    return json.loads((project.run_dir(exp_id) / "pid.json").read_text())["started"]


def test_a_sweep_beside_runs_two_variants_at_once_and_the_third_on_the_gpu_one_frees(side):
    p = side
    (p.path / "train.py").write_text(STEPPING)
    res = p.run("sweep", "--set", "batching.strategy=sorted,shuffle,bucketed", "--steps", "15", "--gpus", "1",
                "--beside", "--json")
    assert res.returncode == 0, res.stderr
    sweep, rows = json.loads(res.stdout)["sweep"], json.loads(res.stdout)["variants"]
    assert [(v["id"], v["status"]) for v in rows] == [(1, "running"), (2, "running"), (3, "queued")], rows
    assert {_printed(p, 1)["visible"], _printed(p, 2)["visible"]} == {"0", "1"}
    # no orch command from here: a variant ends at its budget and the queue starts the third on its GPU
    wait_for(lambda: all((p.run_dir(i) / "exit.json").exists() for i in (1, 2, 3)), timeout=120,
             what="every variant's end")
    ends = {i: json.loads((p.run_dir(i) / "exit.json").read_text())["ended"] for i in (1, 2, 3)}
    assert _printed(p, 3)["visible"] == _printed(p, 1)["visible"]  # sorted's fast steps end first: its GPU
    assert _started_at(p, 2) < ends[1] <= _started_at(p, 3) < ends[2]  # 1 and 2 together, then 3 beside 2
    for exp_id in (1, 2, 3):
        assert "[orch] budget reached (15 steps): SIGINT" in (p.run_dir(exp_id) / "train.log").read_text()
    assert p.run("status").returncode == 0  # the registry learns how they ended
    assert _states(p) == {1: "finished", 2: "finished", 3: "finished"}
    assert [(r["id"], r["status"]) for r in json.loads(p.run("sweep", "show", sweep, "--json").stdout)["variants"]
            if r["status"] != "finished"] == []


def test_sweep_beside_needs_a_gpu_count(side):
    res = side.run("sweep", "--set", "batching.strategy=sorted,shuffle", "--steps", "5", "--beside")
    assert res.returncode == 2, res.stderr
    assert "error: --beside runs the variants side by side on free GPUs" in res.stderr and "hint: " in res.stderr
    assert not side.run_dir(1).exists()  # refused before anything was recorded or started


def test_sweep_stop_stops_every_variant_running_side_by_side_and_no_other_run(side):
    p = side
    (p.path / "train.py").write_text(STEPPING)
    assert p.run("deploy", "--gpus", "1", "-m", "not of the sweep").returncode == 0
    res = p.run("sweep", "--set", "batching.strategy=sorted,shuffle", "--steps", "100000", "--gpus", "1",
                "--json")  # --gpus K alone: the variants go beside each other
    assert res.returncode == 0, res.stderr
    sweep = json.loads(res.stdout)["sweep"]
    assert _states(p) == {1: "running", 2: "running", 3: "queued"}
    assert _printed(p, 2)["visible"] == "1"
    res = p.run("sweep", "stop", sweep)
    assert res.returncode == 0, res.stderr
    assert f"sweep {sweep}: removed from the queue: experiment 3" in res.stdout, res.stdout
    assert f"sweep {sweep}: experiment 2 on local: stopped" in res.stdout, res.stdout
    assert _states(p) == {1: "running", 2: "stopped", 3: "stopped"}


def test_two_lost_runs_side_by_side_both_resume_in_one_session(side):
    """What the reboot units run after a boot (``agent resume RUN_DIR``, one per run): the second to resume gets a
    window beside the first, which keeps running (its session is never killed)."""
    import os
    import signal
    import sys

    p = side
    assert p.run("deploy", "--gpus", "1").returncode == 0
    assert p.run("deploy", "--gpus", "1", "--beside").returncode == 0
    _printed(p, 1), _printed(p, 2)
    agent = json.loads((p.run_dir(1) / "launch.json").read_text())["env"]["PYTHONPATH"].split(os.pathsep)[-1]
    agent = agent[:-2] + ".pyz" if agent.endswith(".d") else agent
    for exp_id in (1, 2):  # the machine went down under both: no exit recorded, nothing alive
        pid = json.loads((p.run_dir(exp_id) / "pid.json").read_text())
        os.killpg(pid["child"], signal.SIGKILL)
        os.kill(pid["supervisor"], signal.SIGKILL)
    subprocess.run(["tmux", "-L", tmux_socket(str(p.root)), "kill-server"], capture_output=True)
    wait_for(lambda: json.loads(p.run("status", "--json", "--no-metrics").stdout)["state"] == "lost",
             what="the runs read as lost")
    for exp_id in (1, 2):
        (p.run_dir(exp_id) / "train.log").write_text("")  # what each prints after its resume
        done = subprocess.run([sys.executable, agent, "resume", str(p.run_dir(exp_id))], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert _printed(p, exp_id)["visible"] == str(exp_id - 1)
    windows = subprocess.run(["tmux", "-L", tmux_socket(str(p.root)), "list-windows", "-t", "orch-tinylm", "-F",
                              "#{window_name}"], capture_output=True, text=True).stdout.split()
    assert sorted(windows) == ["exp1", "exp2"]
    data = json.loads(p.run("status", "--json", "--no-metrics").stdout)
    assert [(r["experiment"], r["state"]) for r in data["live"]] == [(2, "running"), (1, "running")]


def test_bare_attach_opens_the_latest_runs_window_and_e_another(side):
    from tests.cli.test_into import DETACH, cli_argv, drive_pty

    p = side
    assert p.run("deploy", "--gpus", "1").returncode == 0
    assert p.run("deploy", "--gpus", "1", "--beside").returncode == 0
    _printed(p, 1), _printed(p, 2)
    # the pane is the run's supervisor: its first line names the run folder
    code, screen = drive_pty(cli_argv("attach"), p.path, [(f"runs/{p.run_key(2)}", DETACH)])
    assert code == 0, screen
    assert "2 runs of tinylm here; acting on the latest, experiment 2 (-e ID names another)" in screen, screen
    assert f"runs/{p.run_key(1)}" not in screen and "1:exp2*" in screen
    code, screen = drive_pty(cli_argv("attach", "-e", "1"), p.path, [(f"runs/{p.run_key(1)}", DETACH)])
    assert code == 0 and "acting on the latest" not in screen, screen
    assert f"runs/{p.run_key(2)}" not in screen and "0:exp1*" in screen
    assert _states(p) == {1: "running", 2: "running"}


def test_a_queued_beside_run_says_it_waits_on_nvidia_smi_and_starts_once_it_answers(project, tmp_path):
    """nvidia-smi fails (the stand-in's driver gone) as a GPU frees: the queued run beside does not start, and
    ``orch queue``/``status`` say why; once nvidia-smi answers again the target's queue starts it by itself."""
    from tests.testbed import gpu_standin
    from tests.testbed.gpu_standin import gpu_state

    (project.path / "train.py").write_text(TRAIN)
    project.configure()
    state = gpu_state(2, seed=4)
    env = gpu_standin.install_local(tmp_path / "smi", state)
    try:
        for extra in ((), ("--beside",), ("--beside", "--queue")):
            res = project.run("deploy", "--gpus", "1", *extra, env=env)
            assert res.returncode == 0, res.stderr
        _printed(project, 1), _printed(project, 2)
        assert _states(project)[3] == "queued"
        gpu_standin.install_local(tmp_path / "smi", {**state, "driver": False})
        assert project.run("stop", "-e", "1", env=env).returncode == 0

        shown = project.run("queue", "--json", env=env)
        assert shown.returncode == 0, shown.stderr
        (entry,) = json.loads(shown.stdout)["queue"]
        assert entry["id"] == 3 and "waiting for 1 free GPU(s): nvidia-smi fails (NVIDIA-SMI has failed because " \
            "it couldn't communicate with the NVIDIA driver" in entry["waiting"], entry
        assert "experiment 3 has not started: waiting for 1 free GPU(s): nvidia-smi fails" in \
            project.run("queue", env=env).stdout
        status = project.run("status", "--no-metrics", env=env)
        assert "queued 1: experiment 3, waiting for 1 free GPU(s): nvidia-smi fails" in status.stdout, \
            status.stdout
        assert _states(project)[3] == "queued"

        gpu_standin.install_local(tmp_path / "smi", state)  # nvidia-smi answers again; no orch command from here
        assert _printed(project, 3)["visible"] == "0"
    finally:
        project.run("stop", "--all", env=env)


def test_a_guard_over_runs_side_by_side_is_refused_naming_them_and_nothing_changes(side):
    p = side
    for args in (["deploy", "--gpus", "1"], ["deploy", "--gpus", "1", "--beside"]):
        assert p.run(*args).returncode == 0
    before = snapshot(p.root / "checkpoints", p.path / ".orch")
    res = p.run("deploy", "--guard", "--yes")
    assert res.returncode == 2, res.stderr
    assert "error: --guard watches one run against one parent, and 2 runs of this project are up on local " \
           "(experiments " in res.stderr, res.stderr
    assert "node of a job" not in res.stderr and "hint: stop the ones side by side first" in res.stderr
    assert _states(p) == {1: "running", 2: "running"}
    assert snapshot(p.root / "checkpoints", p.path / ".orch") == before
