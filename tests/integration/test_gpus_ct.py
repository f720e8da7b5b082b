"""GPUs on the testbed CTs: the nvidia-smi stand-in inside CTs 200 and 201 (its state set by the test), GPU
passthrough lines in their configs (what the API stand-in reports), and real runs of orch's holding GPUs.

- ``orch gpus`` over both CTs: a GPU held by a process of experiment 1's command (a child of the recorded
  pid) reads ``exp 1 (tinylm)``, one held by a process orch did not start ``busy: pid N, not orch's``;
  a stopped CT shows its passthrough config only.
- ``orch deploy --gpus 2 --ct 200 --ct 201`` picks the CT with two free GPUs and says why; the run prints
  the CUDA_VISIBLE_DEVICES it got; the registry and ``status`` show its GPUs; asking for more than any CT
  has free is refused, naming the holders, and the running experiment is left running.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.integration.test_multinode_ct import _job_project
from tests.integration.test_remote import ROOT, on_ct, remote, wait_state  # noqa: F401  (the fixture)
from tests.testbed import gpu_standin
from tests.testbed.gpu_standin import Passthrough, gpu_state, gpu_uuid

pytestmark = pytest.mark.testbed

COMMAND = 'echo "visible=$CUDA_VISIBLE_DEVICES order=$CUDA_DEVICE_ORDER"; sleep 300 & wait'


def _project(remote) -> None:  # noqa: F811
    _job_project(remote, COMMAND, 'OMP_NUM_THREADS = "1"', extra='\n[distributed]\nlauncher = "none"\n')


def _outsider(testbed, vmid: int) -> int:
    """A process in the CT that orch did not start: its pid there."""
    out = on_ct(testbed, vmid, "sh", "-c", "setsid sleep 300 >/dev/null 2>&1 < /dev/null & echo $!")
    return int(out.strip())


def _gpu_process_of(testbed, vmid: int, run_key: str) -> int:
    """A child of the run's recorded command (the shell line's ``sleep``): the GPU process of a run is often
    not the pid orch recorded."""
    deadline = time.monotonic() + 20
    while True:
        pid = json.loads(on_ct(testbed, vmid, "cat", f"{ROOT}/runs/{run_key}/pid.json"))["child"]
        kids = on_ct(testbed, vmid, "sh", "-c", f"cat /proc/{pid}/task/*/children").split()
        if kids:
            return int(kids[0])
        assert time.monotonic() < deadline, f"the run's command {pid} has no child"
        time.sleep(0.2)


def _rows(res) -> dict:
    """``orch gpus``'s table: (machine, gpu index) -> the row's cells."""
    out = {}
    for line in res.stdout.splitlines():
        cells = [c.strip() for c in line.strip("│┃ ").split("│")]
        # the CTs these tests give GPUs; the testbed may hold others another file made (the Slurm cluster's)
        if len(cells) == 8 and cells[0].startswith(("CT 200 ", "CT 201 ")):
            out[(cells[0], cells[1])] = cells
    return out


def test_gpus_over_two_cts_with_a_run_holding_gpu_1_of_ct_200(remote, testbed):  # noqa: F811
    _project(remote)
    ct200, ct201 = testbed.ct(200), testbed.ct(201)
    with Passthrough((ct200, 2), (ct201, 2)):
        gpu_standin.install_ct(ct200, gpu_state(2, seed=200))
        gpu_standin.install_ct(ct201, gpu_state(2, seed=201))
        res = remote.run("deploy", "--ct", "200")
        assert res.returncode == 0, res.stderr
        holder = _gpu_process_of(testbed, 200, remote.run_key(1))
        stranger = _outsider(testbed, 201)
        gpu_standin.set_ct_state(ct200, gpu_state(2, seed=200, apps={1: [holder]}))
        gpu_standin.set_ct_state(ct201, gpu_state(2, seed=201, apps={0: [stranger]}))

        res = remote.run("gpus")
        assert res.returncode == 0, res.stderr
        rows = _rows(res)
        assert {k: v[7] for k, v in rows.items()} == {
            ("CT 200 (ct200)", "0"): "free", ("CT 200 (ct200)", "1"): "exp 1 (tinylm)",
            ("CT 201 (ct201)", "0"): f"busy: pid {stranger}, not orch's", ("CT 201 (ct201)", "1"): "free"}, res.stdout
        assert rows[("CT 200 (ct200)", "1")][2:7] == ["NVIDIA H100 80GB HBM3", "1024/81559 MiB", "87%", "35 C",
                                                    "312/700 W"]

        data = json.loads(remote.run("gpus", "--json", "--ct", "200").stdout)
        assert [m["ct"] for m in data] == [200]
        ct = data[0]
        assert ct["passthrough"]["count"] == 2 and ct["passthrough"]["indices"] == [0, 1]
        assert [g["uuid"] for g in ct["gpus"]] == [gpu_uuid(200, 0), gpu_uuid(200, 1)]
        assert ct["gpus"][1]["holders"][0]["owner"]["id"] == 1 and ct["gpus"][1]["holders"][0]["pid"] == holder

        unseen = json.loads(remote.run("gpus", "--json", "--ct", "250").stdout)
        assert [(m["ct"], m["error"]) for m in unseen] == \
            [(250, f"the token {testbed.api.token_id} does not see CT 250")]

        testbed.stop(201)
        res = remote.run("gpus", "--ct", "201")
        assert res.returncode == 0, res.stderr
        assert "2 passed through: /dev/nvidia0, /dev/nvidia1" in res.stdout and "stopped" in res.stdout, res.stdout


def test_deploy_gpus_2_picks_the_ct_with_two_free_and_the_run_sees_them(remote, testbed):  # noqa: F811
    _project(remote)
    ct200, ct201 = testbed.ct(200), testbed.ct(201)
    with Passthrough((ct200, 2), (ct201, 2)):
        gpu_standin.install_ct(ct200, gpu_state(2, seed=200, apps={1: [_outsider(testbed, 200)]}))
        gpu_standin.install_ct(ct201, gpu_state(2, seed=201))

        res = remote.run("deploy", "--gpus", "2", "--ct", "200", "--ct", "201", "--wait=10")
        assert res.returncode == 0, res.stderr
        assert "placement: CT 201 on pve1: 2 of 2 GPUs free; the run gets GPUs 0,1" in res.stderr, res.stderr
        assert "not CT 200 on pve1: 1 of 2 free (GPU 1: busy: pid" in res.stderr, res.stderr
        exp = remote.registry().get(1)
        assert exp.target == "ct201" and exp.gpus == [{"index": 0, "uuid": gpu_uuid(201, 0)},
                                                      {"index": 1, "uuid": gpu_uuid(201, 1)}]
        log = on_ct(testbed, 201, "cat", f"{ROOT}/runs/{remote.run_key(1)}/train.log")
        assert "visible=0,1 order=PCI_BUS_ID" in log.splitlines(), log
        status = remote.run("status", "--ct", "201")
        assert "gpu 0 NVIDIA H100 80GB HBM3: 0% busy, 0/81559 MiB (the run's)" in status.stdout, status.stdout

        # none has three free: refused before anything is stopped, naming who holds what
        again = remote.run("deploy", "--gpus", "3", "--ct", "200", "--ct", "201")
        assert again.returncode == 5, again.stderr
        assert "error: no 3 free GPUs on any of the 2 machines: CT 200 on pve1: 1 of 2 free (GPU 1: busy: pid" \
            in again.stderr, again.stderr
        assert "CT 201 on pve1: 2 of 2 free" in again.stderr and "hint: " in again.stderr
        assert wait_state(remote, ["--ct", "201"], ("running",))["experiment"] == 1
        assert len(remote.registry().list()) == 1
