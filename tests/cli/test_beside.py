"""orch deploy --gpus N --beside on the local target with ``[targets.local] gpus = 2``: runs side by side.

Real runs (tmux, the agent, the registry): each prints the GPUs and checkpoint folder it was given and
writes a checkpoint there, so what a run saw is read from its own log and folder.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import snapshot, tmux_socket, wait_for

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
                    what=f"experiment {exp_id}'s first line")
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
    wait_for(lambda: (p.checkpoints / "exp2" / "ckpt-exp2.pt").exists(), what="experiment 2's checkpoint")
    assert first == {"visible": "0", "ckpt": str(p.checkpoints)}
    assert second == {"visible": "1", "ckpt": f"{p.checkpoints}/exp2"}
    assert (p.checkpoints / "ckpt-exp1.pt").exists() and (p.checkpoints / "exp2" / "ckpt-exp2.pt").exists()
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
    assert f"experiment 2 running on GPU 1, revision" in res.stdout and f"checkpoints {p.checkpoints}/exp2" in res.stdout
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
    assert third == {"visible": "0", "ckpt": f"{p.checkpoints}/exp3"}
    assert json.loads((p.run_dir(3) / "experiment.json").read_text())["gpus"] == [{"index": 0, "uuid": None}]
    assert _printed(p, 2)["visible"] == "1"
    data = json.loads(p.run("status", "--json", "--no-metrics").stdout)
    assert [(r["experiment"], r["state"], r["gpus"]) for r in data["live"]] == [(3, "running", [0]),
                                                                                 (2, "running", [1])]


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
