"""GPU facts: a CT config's passthrough lines, nvidia-smi's csv as the agent reads it, who holds a GPU,
and a survey in which one machine that does not answer costs only its own timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from orchestrator.agent.machine import system
from orchestrator.reach import gpu_facts
from tests.testbed.gpu_standin import SCRIPT, gpu_state, gpu_uuid

CONFIG = {
    "hostname": "gpu-a", "cores": 8, "memory": 65536, "unprivileged": 1,
    "dev0": "/dev/nvidia0,gid=44", "dev1": "/dev/nvidia1,gid=44", "dev2": "/dev/nvidiactl",
    "dev3": "/dev/nvidia-uvm", "mp0": "/data,mp=/data",
    "lxc": [["lxc.cgroup2.devices.allow", "c 195:* rwm"], ["lxc.cgroup2.devices.allow", "c 10:200 rwm"],
            ["lxc.mount.entry", "/dev/nvidia2 dev/nvidia2 none bind,optional,create=file"]],
}


def test_passthrough_of_a_ct_config():
    p = gpu_facts.passthrough(CONFIG)
    assert p["count"] == 3
    assert p["indices"] == [0, 1, 2]
    assert p["lines"] == ["dev0: /dev/nvidia0,gid=44", "dev1: /dev/nvidia1,gid=44", "dev2: /dev/nvidiactl",
                          "dev3: /dev/nvidia-uvm", "lxc.cgroup2.devices.allow: c 195:* rwm",
                          "lxc.mount.entry: /dev/nvidia2 dev/nvidia2 none bind,optional,create=file"]


def test_passthrough_of_a_ct_without_gpus_and_of_a_major_only_grant():
    assert gpu_facts.passthrough({"hostname": "cpu", "mp0": "/data,mp=/data"}) == \
        {"count": 0, "indices": [], "lines": []}
    grant = gpu_facts.passthrough({"lxc": [["lxc.cgroup2.devices.allow", "c 195:* rwm"]]})
    assert grant["count"] is None and grant["lines"] == ["lxc.cgroup2.devices.allow: c 195:* rwm"]


def _stand_in_output(tmp_path, state, *argv):
    (tmp_path / "s.json").write_text(json.dumps(state))
    return subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, check=True,
                          env={"NVIDIA_STANDIN_STATE": str(tmp_path / "s.json")}).stdout


def test_the_agent_reads_the_csv_nvidia_smi_prints(tmp_path):
    state = gpu_state(2, seed=3, apps={1: [4411]})
    state["gpus"][0]["power_draw_w"] = None  # a board that does not report its power
    text = _stand_in_output(tmp_path, state, "--query-gpu=" + ",".join(system.GPU_QUERY),
                            "--format=csv,noheader,nounits")
    rows = system.parse_csv(text, system.GPU_KEYS)
    assert [r["uuid"] for r in rows] == [gpu_uuid(3, 0), gpu_uuid(3, 1)]
    assert rows[0]["power_w"] is None and rows[1]["power_w"] == "312.50"
    assert rows[1]["mem_used_mib"] == "1024" and rows[1]["name"] == "NVIDIA H100 80GB HBM3"
    apps = system.parse_csv(_stand_in_output(tmp_path, state, "--query-compute-apps=" + ",".join(system.APP_QUERY),
                                             "--format=csv,noheader,nounits"), system.APP_KEYS)
    assert apps == [{"pid": "4411", "gpu_uuid": gpu_uuid(3, 1), "process_name": "python3", "mem_used_mib": "1024"}]


def test_an_owner_is_found_through_the_process_tree():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        owners = {os.getpid(): {"id": 14, "registry": "ab", "project": "tinylm"}}
        assert system._owner(child.pid, owners) == owners[os.getpid()]
        assert system._owner(child.pid, {}) is None
        assert system._owner("[N/A]", owners) is None
    finally:
        child.kill()
        child.wait()


def test_who_holds_a_gpu():
    report = {"gpus": [{"index": "0", "uuid": "GPU-a", "mem_used_mib": "0"},
                       {"index": "1", "uuid": "GPU-b", "mem_used_mib": "2048"},
                       {"index": "2", "uuid": "GPU-c", "mem_used_mib": "1024", "power_w": None}],
              "apps": [{"pid": "900", "gpu_uuid": "GPU-b", "owner": {"id": 14, "project": "tinylm"}},
                       {"pid": "901", "gpu_uuid": "GPU-b", "owner": {"id": 14, "project": "tinylm"}},
                       {"pid": "4411", "gpu_uuid": "GPU-c", "owner": None}]}
    rows = gpu_facts.gpus_of(report)
    assert [r["use"] for r in rows] == ["free", "exp 14 (tinylm)", "busy: pid 4411, not orch's"]
    assert [r["free"] for r in rows] == [True, False, False]
    assert rows[1]["index"] == 1 and rows[1]["mem_used_mib"] == 2048 and rows[2]["power_w"] is None


def test_a_machine_that_does_not_answer_costs_only_its_own_timeout():
    from orchestrator.errors import TargetError

    def hangs():
        time.sleep(30)
        return {}

    def refuses():
        raise TargetError("CT 202 is not reachable", hint="start it")

    began = time.monotonic()
    got = gpu_facts.survey([("a", lambda: {"gpus": [1]}), ("b", hangs), ("c", refuses)], timeout=1.0)
    took = time.monotonic() - began
    assert got["a"] == {"gpus": [1]}
    assert got["b"] == {"error": "no answer within 1 s", "timed_out": True}
    assert got["c"]["error"] == "CT 202 is not reachable"
    assert took < 5


def test_gpus_whose_processes_cannot_be_read_are_not_free():
    rows = gpu_facts.gpus_of({"gpus": [{"index": "0", "uuid": "GPU-a"}], "apps": [],
                              "apps_error": "Unable to determine the device handle"})
    assert rows[0]["free"] is False and rows[0]["use"] == "unknown: Unable to determine the device handle"
