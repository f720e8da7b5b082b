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
