"""``orch doctor`` and the deploy preflight on a real container with GPUs passed through, as far as a machine
without GPUs can have them.

CT 203's PVE config (the API stand-in's view, from a ``pve.conf`` beside its LXC config) passes GPUs the way
PVE does (``devN: /dev/nvidiaK``, or ``lxc.mount.entry`` with ``lxc.cgroup2.devices.allow``); its real LXC
config grants the device majors the way PVE's generated one does, so the kernel's device cgroup answers for
real. In the CT the device nodes are made with ``mknod`` (NVIDIA's major 195; ``nvidia-uvm``'s major is
dynamic: 511 here), and ``nvidia-smi`` is the testbed's stand-in, on the node and in the CT, each with its own
state: different driver versions there are a driver/library mismatch.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import EXAMPLE
from tests.integration.test_multinode_ct import _job_project
from tests.integration.test_remote import SMALL_BATCHES, RemoteProject, on_ct, remote  # noqa: F401  (the fixture)
from tests.testbed import gpu_standin, torchsite
from tests.testbed.lxc import Container

pytestmark = pytest.mark.testbed

VMID = 203
UVM = 511  # nvidia-uvm's major: dynamic, given by the kernel when the module loads
DRIVER = "550.127.05"
OLD = "535.183.01"
GPUS = ["/dev/nvidia0", "/dev/nvidia1"]
NODES = {"/dev/nvidia0": (195, 0), "/dev/nvidia1": (195, 1), "/dev/nvidiactl": (195, 255),
         "/dev/nvidia-uvm": (UVM, 0), "/dev/nvidia-uvm-tools": (UVM, 1)}
DEV_FORM = [f"dev{i}: {p}" for i, p in enumerate([*GPUS, "/dev/nvidiactl", "/dev/nvidia-uvm"])]


@dataclass
class GpuContainer(Container):
    """A testbed CT whose LXC config grants device majors, as PVE's generated config does for passthrough."""

    majors: tuple[int, ...] = ()

    def _config(self) -> str:
        return super()._config() + "".join(f"lxc.cgroup.devices.allow = c {m}:* rwm\n"
                                           f"lxc.cgroup2.devices.allow = c {m}:* rwm\n" for m in self.majors)


@dataclass
class Gpus:
    ct: GpuContainer
    project: RemoteProject
    node_state: Path

    def doctor(self, *args: str):
        return self.project.cli("doctor", "--target", "gpu", *args)

    def findings(self) -> dict[str, dict]:
        res = self.doctor("--json")
        assert res.exit_code in (0, 6), res.output
        report = json.loads(res.stdout)
        return {f["check"]: f for f in report["findings"]}

    def set_ct_state(self, **kw) -> None:
        gpu_standin.set_ct_state(self.ct, gpu_standin.gpu_state(len(GPUS), **kw))

    def libraries(self, *versions: str) -> None:
        self.ct.attach("sh", "-c", "rm -f /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.*")
        for v in versions:
            self.ct.attach("touch", f"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{v}")


@pytest.fixture
def gpu_ct(testbed, tmp_path, monkeypatch):
    """gpu_ct(pve=DEV_FORM, majors=(195, UVM), nodes=NODES, torch=False) -> Gpus: CT 203 with those pct.conf lines, LXC
    rules and device nodes, the stand-in in it and on the node (driver DRIVER both), a 2 GiB /dev/shm, and a
    project whose target ``gpu`` is CT 203 through its node."""
    monkeypatch.setenv("ORCH_PROXMOX_TOKEN", testbed.api.token_secret)
    made: list[GpuContainer] = []
    node_smi = testbed.node.state_dir / "bin" / "nvidia-smi"

    def make(pve: list[str] = DEV_FORM, majors: tuple[int, ...] = (195, UVM),
             nodes: dict[str, tuple[int, int]] = NODES, torch: bool = False) -> Gpus:
        ct = GpuContainer(VMID, testbed.base, testbed.public_key, majors=majors)
        ct.create()
        made.append(ct)
        (ct.dir / "pve.conf").write_text("".join(f"{line}\n" for line in pve))
        ct.start()
        if torch:  # the testbed's CPU build of torch, which sees no GPU
            torchsite.mount(ct, torchsite.ensure_site())
        for path, (major, minor) in nodes.items():
            ct.attach("mknod", "-m", "666", path, "c", str(major), str(minor))
        ct.attach("mount", "-t", "tmpfs", "-o", "size=2g", "tmpfs", "/dev/shm")
        gpu_standin.install_ct(ct, gpu_standin.gpu_state(len(GPUS), driver=DRIVER))
        state = tmp_path / "node-nvidia.json"
        state.write_text(json.dumps(gpu_standin.gpu_state(len(GPUS), driver=DRIVER)))
        node_smi.write_text(f"#!/bin/sh\nNVIDIA_STANDIN_STATE={state} exec python3 {gpu_standin.SCRIPT} \"$@\"\n")
        node_smi.chmod(0o755)
        path = tmp_path / "proj"
        path.mkdir(exist_ok=True)
        (path / "train.py").write_bytes((EXAMPLE / "train.py").read_bytes())
        project = RemoteProject(path, testbed)
        project.write(entries=False, extra=SMALL_BATCHES + f'\n[targets.gpu]\nkind = "proxmox"\nct = {VMID}\n'
                      'access = "pct"\n')
        gpus = Gpus(ct, project, state)
        gpus.libraries(DRIVER)
        return gpus

    yield make
    node_smi.unlink(missing_ok=True)
    for ct in made:
        ct.destroy()


def test_a_healthy_ct_is_all_ok(gpu_ct):
    gpus = gpu_ct()
    res = gpus.doctor()
    assert res.exit_code == 0, res.output
    assert "FAIL" not in res.output and "WARN" not in res.output
    found = gpus.findings()
    assert {f["status"] for f in found.values()} == {"ok"}, found
    assert found["node driver"]["reason"] == f"node pve1 runs driver {DRIVER}"
    assert DRIVER in found["user-space driver"]["reason"]
    for path in [*GPUS, "/dev/nvidiactl", "/dev/nvidia-uvm"]:
        assert path in found[f"device {path}"]["reason"]
    assert "195:1" in found["device /dev/nvidia1"]["reason"] and f"{UVM}:0" in found["device /dev/nvidia-uvm"]["reason"]
    assert found["/dev/shm"]["reason"] == "/dev/shm is 2.0 GiB for 2 GPUs"
    assert "not installed" in found["torch"]["reason"]
    assert {"python", "tmux", "clock", "space root"} <= set(found)


def test_a_driver_mismatch_is_found_with_the_installer_to_run(gpu_ct):
    gpus = gpu_ct()
    # the CT's user space is older than the node's kernel module: NVML refuses (nvidia-smi exits 18)
    gpus.set_ct_state(driver=DRIVER, library_version=OLD)
    gpus.libraries(OLD)
    res = gpus.doctor()
    assert res.exit_code == 6, res.output
    assert "FAIL  user-space driver" in res.output
    assert "Driver/library version mismatch" in res.output and "535.183" in res.output
    assert f"fix: pct exec {VMID} -- sh NVIDIA-Linux-x86_64-{DRIVER}.run --no-kernel-module" in res.output

    # the CT's own nvidia-smi reports another driver than the node's (and its libnvidia-ml says the same)
    gpus.set_ct_state(driver=OLD)
    found = gpus.findings()
    assert found["user-space driver"]["status"] == "fail"
    assert found["user-space driver"]["reason"].startswith(f"user space has driver {OLD} but the kernel module "
                                                            f"is {DRIVER}")
    assert found["node driver"]["status"] == "ok"


def test_a_passed_device_missing_in_the_ct(gpu_ct):
    gpus = gpu_ct(nodes={p: n for p, n in NODES.items() if p != "/dev/nvidia1"})
    found = gpus.findings()
    missing = found["device /dev/nvidia1"]
    assert missing["status"] == "fail"
    assert missing["reason"] == "/dev/nvidia1 is passed through (dev1) but is missing in the CT"
    assert missing["fix"] == f"on node pve1: ls -l /dev/nvidia1 && pct reboot {VMID}"
    assert found["device /dev/nvidia0"]["status"] == "ok"


def test_a_cgroup_rule_that_does_not_grant_the_major(gpu_ct):
    # the mount-entry form: PVE does not allow these itself; the rule grants 195 but nvidia-uvm's major moved
    pve = [f"lxc.mount.entry: {p} {p[1:]} none bind,optional,create=file" for p in NODES] + \
          ["lxc.cgroup2.devices.allow: c 195:* rwm"]
    gpus = gpu_ct(pve=pve, majors=(195,))
    res = gpus.doctor()
    assert res.exit_code == 6, res.output
    found = gpus.findings()
    uvm = found["device /dev/nvidia-uvm"]
    assert uvm["status"] == "fail"
    assert uvm["reason"] == (f"/dev/nvidia-uvm is {UVM}:0 but no lxc.cgroup2.devices.allow rule of CT {VMID} "
                             f"grants major {UVM}")
    assert uvm["fix"].startswith(f"pct set {VMID} -dev0 /dev/nvidia-uvm")
    assert f"c {UVM}:* rwm" in uvm["fix"]
    assert found["device /dev/nvidia0"]["status"] == "ok"
    # and the kernel agrees: the CT cannot open it
    opened = gpus.ct.attach("python3", "-c", "import os; os.open('/dev/nvidia-uvm', os.O_RDWR)", check=False)
    assert b"PermissionError" in opened.stderr


def test_a_64m_dev_shm_fails_for_two_gpus(gpu_ct):
    gpus = gpu_ct()
    gpus.ct.attach("mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", "/dev/shm")  # over the 2 GiB one
    found = gpus.findings()
    shm = found["/dev/shm"]
    assert shm["status"] == "fail"
    assert shm["reason"].startswith("/dev/shm is 64 MiB: NCCL between 2 GPUs needs at least 1.0 GiB")
    assert shm["fix"].startswith(f"pct exec {VMID} -- mount -o remount,size=16G /dev/shm")


def test_json_gives_every_finding(gpu_ct):
    gpus = gpu_ct(nodes={p: n for p, n in NODES.items() if p != "/dev/nvidia1"})
    res = gpus.doctor("--json")
    assert res.exit_code == 6
    report = json.loads(res.stdout)
    assert report["ct"] == VMID and report["node"] == "pve1" and report["status"] == "fail"
    assert all(set(f) == {"check", "status", "reason", "fix"} for f in report["findings"])
    assert [f["check"] for f in report["findings"] if f["status"] == "fail"] == ["device /dev/nvidia1"]


def test_torch_seeing_no_gpu_fails_the_doctor_but_not_the_deploy_preflight_which_skips_torch(gpu_ct):
    gpus = gpu_ct(torch=True)
    res = gpus.doctor()
    assert res.exit_code == 6, res.output
    found = gpus.findings()
    assert found["torch"]["status"] == "fail"
    assert found["torch"]["reason"].startswith("torch 2.13.0+cpu sees 0 GPUs (cuda.is_available() False) of the 2 "
                                               "passed through (a CPU-only build: install a CUDA wheel)")
    assert [c for c, f in found.items() if f["status"] != "ok"] == ["torch"]
    res = gpus.project.cli("deploy", "--target", "gpu", "-m", "cheap checks only")
    assert res.exit_code == 0, res.output
    assert "torch" not in res.output


def _status(project: RemoteProject) -> dict:
    res = project.cli("status", "--target", "gpu", "--json", "--no-metrics")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_a_deploy_refused_by_a_failed_check_leaves_the_old_run_running(gpu_ct):
    gpus = gpu_ct()
    res = gpus.project.cli("deploy", "--target", "gpu", "-m", "first", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["experiment"]["status"] == "running"
    gpus.set_ct_state(driver=DRIVER, library_version=OLD)  # the node's driver was upgraded under the CT

    res = gpus.project.cli("deploy", "--target", "gpu", "--dry-run")
    assert res.exit_code == 0, res.output
    assert "2. doctor: check the GPU driver and devices" in res.output
    assert "    fail: user-space driver: nvidia-smi: Failed to initialize NVML: Driver/library version mismatch" \
        in res.output
    assert "  the launch would be refused (exit 6)" in res.output

    res = gpus.project.cli("deploy", "--target", "gpu", "-m", "second")
    assert res.exit_code == 6, res.output
    assert "error: CT 203 on pve1 is not fit to run: user-space driver: nvidia-smi: Failed to initialize NVML: " \
           "Driver/library version mismatch" in res.output
    assert f"hint: fix: pct exec {VMID} -- sh NVIDIA-Linux-x86_64-{DRIVER}.run --no-kernel-module" in res.output
    rows = gpus.project.registry().list()
    assert [(r.id, r.status) for r in rows] == [(1, "running")]
    assert _status(gpus.project)["state"] == "running"
    assert subprocess.run(["lxc-attach", "-n", str(VMID), "--", "pgrep", "-f", "train.py"],
                          capture_output=True).returncode == 0

    res = gpus.project.cli("restart", "--target", "gpu")
    assert res.exit_code == 6, res.output
    assert [(r.id, r.status) for r in gpus.project.registry().list()] == [(1, "running")]


def test_a_job_with_one_node_failing_a_check_starts_nowhere(remote, testbed):  # noqa: F811
    _job_project(remote, "sleep 300", 'OMP_NUM_THREADS = "1"', extra='\n[distributed]\nlauncher = "none"\n')
    ct200, ct201 = testbed.ct(200), testbed.ct(201)
    with gpu_standin.Passthrough((ct200, 2), (ct201, 2)):
        for ct in (ct200, ct201):
            gpu_standin.install_ct(ct, gpu_standin.gpu_state(2))
        ct201.attach("mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", "/dev/shm")
        res = remote.run("deploy", "--ct", "200", "--ct", "201")
    assert res.returncode == 6, res.stderr
    assert "node 1 (CT 201" in res.stderr and "/dev/shm is 64 MiB: NCCL between 2 GPUs needs at least 1.0 GiB" \
        in res.stderr and "nothing was started on any node" in res.stderr, res.stderr
    assert remote.registry().get(1).status == "failed"
    for vmid in (200, 201):
        assert on_ct(testbed, vmid, "sh", "-c", "ls /workspace/orch/runs 2>/dev/null || true").strip() == ""
