"""The doctor's verdicts on facts as the agent and the Proxmox API report them (the testbed tests run the same
checks on a real CT; these cover the shapes a testbed CT cannot take: unprivileged CTs, real torch, bare hosts)."""

from __future__ import annotations

from orchestrator.watch.doctor_checks import GIB, MIB, Facts, allowed, cgroup_rules, judge, library_version, worst

NOW = 1_700_000_000.0


def dev(path: str, major: int, minor: int, *, mode: int = 0o666, access: bool = True, opened: str = "ok",
        gid: int = 0) -> dict:
    return {"path": path, "exists": True, "char": True, "major": major, "minor": minor, "mode": mode, "uid": 0,
            "gid": gid, "access": access, "open": opened}


def agent(**kw) -> dict:
    base = {"time": NOW, "python": "3.11.2", "executable": "/usr/bin/python3", "tmux": "tmux 3.3a",
            "user": {"uid": 1000, "gid": 1000, "groups": [1000]}, "devices": [],
            "nvidia_smi": {"found": False}, "nvml_libraries": [], "kernel_module": None,
            "shm": {"path": "/dev/shm", "total": 8 * GIB, "free": 8 * GIB},
            "space": {"root": {"path": "/r", "total": 100 * GIB, "free": 50 * GIB}}}
    base.update(kw)
    return base


def smi_ok(version: str = "550.127.05", gpus: int = 1) -> dict:
    return {"found": True, "error": None, "exit_code": None, "driver_version": version,
            "gpus": [{"index": str(i)} for i in range(gpus)]}


def ct(devices: dict | None = None, lxc: list | None = None, unprivileged: bool = False) -> dict:
    return {"vmid": 200, "node": "pve1", "config": {"devices": devices or {}, "lxc": lxc or [],
                                                    "unprivileged": unprivileged}}


def by_check(facts: Facts) -> dict:
    return {f.check: f for f in judge(facts)}


HEALTHY_DEVS = [dev("/dev/nvidia0", 195, 0), dev("/dev/nvidiactl", 195, 255), dev("/dev/nvidia-uvm", 508, 0)]


def test_an_unprivileged_ct_without_gid_cannot_open_its_gpu_and_is_told_the_devn_gid_form():
    devices = [dev("/dev/nvidia0", 195, 0, mode=0o660, access=False, opened="EACCES"), *HEALTHY_DEVS[1:]]
    found = by_check(Facts(agent=agent(devices=devices, nvidia_smi=smi_ok()), node_smi=smi_ok(),
                           ct=ct({"dev0": "/dev/nvidia0", "dev1": "/dev/nvidiactl", "dev2": "/dev/nvidia-uvm"},
                                 unprivileged=True), sent=NOW, received=NOW))
    gpu = found["device /dev/nvidia0"]
    assert gpu.status == "fail" and "cannot be opened read-write by uid 1000" in gpu.reason
    assert gpu.fix == "pct set 200 -dev0 /dev/nvidia0,gid=1000"
    assert found["device /dev/nvidiactl"].status == "ok"


def test_a_control_node_not_passed_is_named_with_the_next_free_devn():
    found = by_check(Facts(agent=agent(devices=HEALTHY_DEVS[:2], nvidia_smi=smi_ok()), node_smi=smi_ok(),
                           ct=ct({"dev0": "/dev/nvidia0", "dev1": "/dev/nvidiactl"}), sent=NOW, received=NOW))
    uvm = found["device /dev/nvidia-uvm"]
    assert uvm.status == "fail" and uvm.reason == "/dev/nvidia-uvm is not passed through to CT 200"
    assert uvm.fix == "on node pve1: nvidia-modprobe -u -c=0 && pct set 200 -dev2 /dev/nvidia-uvm"


def test_cgroup_rules_need_read_and_write_of_the_major_and_accept_the_v1_key():
    rules = cgroup_rules({"lxc": ["lxc.cgroup2.devices.allow: c 195:* m", "lxc.cgroup.devices.allow: c 508:0 rwm",
                                  "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file"]})
    assert not allowed(rules, 195, 0)  # mknod only
    assert allowed(rules, 508, 0) and not allowed(rules, 508, 1)
    assert allowed([("a", "*", "*", "rwm")], 195, 3)


def test_torch_seeing_no_gpu_fails_only_where_gpus_are_passed_through():
    cpu_torch = {"installed": True, "version": "2.13.0+cpu", "cuda": None, "available": False, "count": 0}
    found = by_check(Facts(agent=agent(devices=HEALTHY_DEVS, nvidia_smi=smi_ok(), torch=cpu_torch),
                           node_smi=smi_ok(), sent=NOW, received=NOW,
                           ct=ct({"dev0": "/dev/nvidia0", "dev1": "/dev/nvidiactl", "dev2": "/dev/nvidia-uvm"})))
    assert found["torch"].status == "fail"
    assert found["torch"].reason.startswith("torch 2.13.0+cpu sees 0 GPUs (cuda.is_available() False) of the 1 "
                                            "passed through (a CPU-only build")
    plain = by_check(Facts(agent=agent(torch=cpu_torch), sent=NOW, received=NOW))
    assert plain["torch"].status == "ok" and plain["torch"].reason == "torch 2.13.0+cpu sees 0 GPUs"


def test_a_machine_without_gpus_gets_no_gpu_checks():
    found = judge(Facts(agent=agent(), sent=NOW, received=NOW))
    assert [f.check for f in found] == ["/dev/shm", "space root", "python", "tmux", "clock"]
    assert worst(found) == "ok"


def test_one_gpu_with_a_small_dev_shm_is_a_warning_several_a_failure():
    small = {"path": "/dev/shm", "total": 64 * MIB, "free": 64 * MIB}
    one = by_check(Facts(agent=agent(shm=small, devices=HEALTHY_DEVS, nvidia_smi=smi_ok()), sent=NOW, received=NOW))
    assert one["/dev/shm"].status == "warn"
    two = by_check(Facts(agent=agent(shm=small, devices=[*HEALTHY_DEVS, dev("/dev/nvidia1", 195, 1)],
                                     nvidia_smi=smi_ok(gpus=2)), sent=NOW, received=NOW))
    assert two["/dev/shm"].status == "fail" and two["/dev/shm"].fix.startswith("mount -o remount,size=16G /dev/shm")


def test_a_bare_host_compares_nvml_with_the_loaded_kernel_module_and_a_skewed_clock_warns():
    facts = Facts(agent=agent(devices=HEALTHY_DEVS, nvidia_smi=smi_ok("535.183.01"),
                              nvml_libraries=["libnvidia-ml.so", "libnvidia-ml.so.1", "libnvidia-ml.so.535.183.01"],
                              kernel_module="NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.127.05  Tue Oct 8",
                              time=NOW + 30), sent=NOW, received=NOW + 0.2)
    found = by_check(facts)
    assert found["user-space driver"].status == "fail"
    assert "535.183.01 but the kernel module is 550.127.05" in found["user-space driver"].reason
    assert found["clock"].status == "warn" and "+29.9 s off" in found["clock"].reason
    assert library_version("libnvidia-ml.so.1") is None and library_version("libnvidia-ml.so.550.54.15") == "550.54.15"


def test_low_space_warns_and_a_root_below_the_preflight_minimum_fails():
    space = {"root": {"path": "/r", "total": GIB, "free": 10 * MIB},
             "checkpoints": {"path": "/c", "total": GIB, "free": 10 * MIB}}
    found = by_check(Facts(agent=agent(space=space), sent=NOW, received=NOW, min_free_mb=50))
    assert found["space root"].status == "fail" and found["space checkpoints"].status == "warn"
    space["root"]["free"] = 500 * MIB
    assert by_check(Facts(agent=agent(space=space), sent=NOW, received=NOW))["space root"].status == "warn"


def test_the_nodes_answer_is_read_with_the_agents_parser_and_a_node_without_driver_fails():
    from orchestrator.watch.doctor import node_report

    ok = node_report(0, "0, 550.127.05\n1, 550.127.05\n", "")
    assert ok["driver_version"] == "550.127.05" and len(ok["gpus"]) == 2
    down = node_report(9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure "
                          "that the latest NVIDIA driver is installed and running.\n", "")
    facts = Facts(agent=agent(devices=HEALTHY_DEVS, nvidia_smi=smi_ok()), node_smi=down, sent=NOW, received=NOW,
                  ct=ct({"dev0": "/dev/nvidia0", "dev1": "/dev/nvidiactl", "dev2": "/dev/nvidia-uvm"}))
    node = by_check(facts)["node driver"]
    assert node.status == "fail" and "couldn't communicate with the NVIDIA driver" in node.reason
    assert node.fix == "on node pve1: modprobe nvidia && nvidia-smi"
    missing = by_check(Facts(agent=facts.agent, node_smi={"found": False}, ct=facts.ct, sent=NOW, received=NOW))
    assert missing["node driver"].status == "warn"


def test_a_tmux_older_than_orch_needs_fails_the_check():
    old = by_check(Facts(agent=agent(tmux="tmux 3.1c"), sent=NOW, received=NOW))["tmux"]
    assert old.status == "fail" and old.reason.startswith("tmux 3.1c: orch needs tmux 3.2 or newer")
    assert by_check(Facts(agent=agent(tmux="tmux next-3.6"), sent=NOW, received=NOW))["tmux"].status == "ok"
