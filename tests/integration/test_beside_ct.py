"""Runs side by side on a testbed CT (CT 200 over SSH) with the nvidia-smi stand-in showing 2 GPUs.

Two experiments on disjoint GPUs, each reading its own ``CUDA_VISIBLE_DEVICES`` and writing a checkpoint in a
folder of its own (read in the CT, from what the script printed and wrote); a third refused naming the holders;
with ``--queue`` the third waits and the CT's queue starts it on the GPU ``orch stop -e 1`` frees; bare
``status`` lists both runs and a bare ``stop`` stops the latest and says so.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.cli.test_beside import TRAIN
from tests.integration.test_remote import CKPT, ROOT, on_ct, remote  # noqa: F401  (the fixture)
from tests.testbed import gpu_standin
from tests.testbed.gpu_standin import Passthrough, gpu_state, gpu_uuid

pytestmark = pytest.mark.testbed

NOTE = "orch: 2 runs of tinylm here; acting on the latest, experiment {} (-e ID names another)"


def _printed(remote, testbed, exp_id: int, timeout: float = 60) -> dict:  # noqa: F811
    """What experiment ``exp_id``'s script printed in CT 200: its GPUs and checkpoint folder."""
    log = f"{ROOT}/runs/{remote.run_key(exp_id)}/train.log"
    deadline = time.monotonic() + timeout
    while True:
        text = testbed.ct(200).attach("sh", "-c", 'cat "$1" 2>/dev/null || true', "sh", log).stdout.decode()
        line = next((ln for ln in text.splitlines() if ln.startswith("visible=")), None)
        if line:
            return dict(part.split("=", 1) for part in line.split())
        assert time.monotonic() < deadline, f"experiment {exp_id} printed nothing: {text!r}"
        time.sleep(0.3)


def _states(remote) -> dict[int, str]:  # noqa: F811
    return {e.id: e.status for e in remote.rows()}


def test_side_by_side_on_a_ct_refused_queued_and_bare_commands(remote, testbed):  # noqa: F811
    (remote.path / "train.py").write_text(TRAIN)
    ct = testbed.ct(200)
    with Passthrough((ct, 2)):
        gpu_standin.install_ct(ct, gpu_state(2, seed=200))
        res = remote.run("deploy", "--ct", "200", "--gpus", "1")
        assert res.returncode == 0, res.stderr
        res = remote.run("deploy", "--ct", "200", "--gpus", "1", "--beside")
        assert res.returncode == 0, res.stderr
        assert "placement: CT 200 on pve1: GPU 0: experiment 1 (tinylm); GPU 1: free; the run gets GPU 1, beside " \
               "the running experiments (none is stopped)" in res.stderr, res.stderr
        rows = {e.id: e for e in remote.rows()}
        ckpt = rows[1].checkpoints  # the first run keeps the project's folder; the one beside it gets its own
        assert ckpt.startswith(CKPT) and rows[2].checkpoints == f"{ckpt}@exp2"
        assert _printed(remote, testbed, 1) == {"visible": "0", "ckpt": ckpt}
        assert _printed(remote, testbed, 2) == {"visible": "1", "ckpt": f"{ckpt}@exp2"}
        files = on_ct(testbed, 200, "find", os.path.dirname(ckpt), "-name", "ckpt-*.pt").split()
        assert sorted(files) == [f"{ckpt}/ckpt-exp1.pt", f"{ckpt}@exp2/ckpt-exp2.pt"], files  # siblings
        with remote.registry() as reg:
            assert reg.get(2).gpus == [{"index": 1, "uuid": gpu_uuid(200, 1)}]

        res = remote.run("deploy", "--ct", "200", "--gpus", "1", "--beside")
        assert res.returncode == 5, res.stderr
        assert "error: no 1 free GPU on CT 200 on pve1 beside the running experiments: GPU 0: experiment 1 " \
               "(tinylm); GPU 1: experiment 2 (tinylm)" in res.stderr, res.stderr
        assert "hint: queue it with --queue" in res.stderr and "orch stop -e 1" in res.stderr
        assert _states(remote) == {1: "running", 2: "running"}
        assert on_ct(testbed, 200, "ls", f"{ROOT}/runs").split() == [remote.run_key(1), remote.run_key(2)]

        res = remote.run("status", "--ct", "200", "--no-metrics")
        assert res.returncode == 0 and NOTE.format(2) in res.stderr, res.stderr
        assert "2 runs side by side here:" in res.stdout and "experiment 1 running on GPU 0" in res.stdout, res.stdout

        res = remote.run("deploy", "--ct", "200", "--gpus", "1", "--beside", "--queue")
        assert res.returncode == 0, res.stderr
        assert "experiment 3: queued on CT 200 on pve1 at position 1" in res.stdout, res.stdout
        res = remote.run("stop", "--ct", "200", "-e", "1")
        assert res.returncode == 0 and "experiment 1 on CT 200 on pve1: stopped" in res.stdout, res.stdout
        assert _printed(remote, testbed, 3) == {"visible": "0", "ckpt": f"{ckpt}@exp3"}
        data = json.loads(remote.run("status", "--ct", "200", "--json", "--no-metrics").stdout)
        assert [(r["experiment"], r["gpus"]) for r in data["live"]] == [(3, [0]), (2, [1])], data["live"]

        res = remote.run("stop", "--ct", "200")
        assert res.returncode == 0 and NOTE.format(3) in res.stderr, res.stderr
        assert "experiment 3 on CT 200 on pve1: stopped" in res.stdout, res.stdout
        assert _states(remote) == {1: "stopped", 2: "running", 3: "stopped"}
        assert remote.run("stop", "--ct", "200").returncode == 0
        assert _states(remote) == {1: "stopped", 2: "stopped", 3: "stopped"}
