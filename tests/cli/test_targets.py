"""`orch targets` against the Proxmox API stand-in: visible CTs, their GPUs, and where this project ran."""

from __future__ import annotations

import json
import pytest

from tests.testbed.pve_backends import MemoryBackend, MemoryCt
from tests.testbed.pve_standin import Token, start_standin

SECRET = "11111111-2222-3333-4444-555555555555"
STATIC = "name=eth0,bridge=vmbr0,gw=10.77.0.1,hwaddr=BC:24:11:00:00:C9,ip=10.77.0.201/24,type=veth"
MOUNT = "/dev/nvidia{n} dev/nvidia{n} none bind,optional,create=file"


@pytest.fixture
def api():
    backend = MemoryBackend([
        MemoryCt(200, name="trainer", addresses=["10.77.0.200/24"], config={  # two GPUs, as device entries
            "dev0": "/dev/nvidia0,gid=44", "dev1": "/dev/nvidia1,gid=44", "dev2": "/dev/nvidiactl",
            "dev3": "/dev/nvidia-uvm"}),
        MemoryCt(201, running=False, config={"net0": STATIC}),  # no GPU, a static address while stopped
        MemoryCt(202, name="raw", addresses=["10.77.0.202/24"], config={"lxc": [  # the pre-8.2 way: raw lxc lines
            ["lxc.cgroup2.devices.allow", "c 195:* rwm"], ["lxc.mount.entry", MOUNT.format(n=0)],
            ["lxc.mount.entry", MOUNT.format(n=1)], ["lxc.mount.entry", MOUNT.format(n=2)],
            ["lxc.mount.entry", "/dev/nvidiactl dev/nvidiactl none bind,optional,create=file"]]}),
        MemoryCt(203, addresses=["10.77.0.203/24"], config={"lxc": [["lxc.cgroup2.devices.allow", "c 195:* rwm"]]}),
    ])
    with start_standin(backend, tokens={"root@pam!orch": Token(SECRET)}, token_id="root@pam!orch",
                       qemu={300: "win11"}) as standin:
        yield standin


def _configure(project, api) -> None:
    project.configure(extra=f"""
[proxmox]
host = "{api.host}"
port = {api.port}
token_id = "root@pam!orch"
verify_ssl = "{api.cert_path}"
timeout = 5

[targets.trainer]
kind = "proxmox"
ct = 200
""")


def _record(project, machine: str | None, target: str, name: str = "tinylm") -> int:
    with project.registry() as reg:
        return reg.create(project=name, target=target, machine=machine, revision="0" * 16, command=["x"],
                          status="finished").id


def test_targets_lists_cts_with_gpus_addresses_and_this_projects_runs(project, api, monkeypatch):
    _configure(project, api)
    monkeypatch.setenv("ORCH_PROXMOX_TOKEN", SECRET)
    first = _record(project, f"ct:200@{api.host}:/workspace/orch", "trainer")
    second = _record(project, f"ct:200@{api.host}:/workspace/orch", "ct200")
    _record(project, f"ct:201@{api.host}:/workspace/orch", "ct201", name="other")  # another project's run
    _record(project, "ct:202@elsewhere:/workspace/orch", "ct202")  # another cluster's CT 202
    old = _record(project, None, "trainer")  # a row from before machine keys: matched by its target name
    res = project.cli("targets", "--json")
    assert res.exit_code == 0, res.output
    rows = {r["ct"]: r for r in json.loads(res.stdout)}
    assert sorted(rows) == [200, 201, 202, 203]  # the QEMU VM 300 is not a container
    ct200 = rows[200]
    assert (ct200["name"], ct200["node"], ct200["status"], ct200["address"]) == ("trainer", "pve1", "running",
                                                                                  "10.77.0.200")
    assert ct200["gpus"] == 2 and "/dev/nvidiactl" in ct200["gpu_devices"]
    assert ct200["runs"] == [old, second, first] and ct200["entries"] == ["trainer"]
    assert (rows[201]["status"], rows[201]["address"], rows[201]["gpus"], rows[201]["runs"]) == \
        ("stopped", "10.77.0.201", 0, [])
    assert rows[202]["gpus"] == 3 and rows[202]["runs"] == []
    assert rows[203]["gpus"] is None and rows[203]["gpu_devices"]  # c 195:* alone: GPUs, count unknown

    human = project.cli("targets")
    assert human.exit_code == 0, human.output
    line = next(ln for ln in human.stdout.splitlines() if "trainer" in ln and "200" in ln)
    assert "10.77.0.200" in line and "3 (latest" in line
    assert "yes (count unknown)" in human.stdout


def test_targets_without_a_proxmox_section_says_what_to_add(project):
    res = project.cli("targets")
    assert res.exit_code == 2
    assert "error: orch targets lists Proxmox containers" in res.output and "hint: add [proxmox]" in res.output


def test_targets_with_a_token_that_sees_nothing(project, api, monkeypatch):
    api.tokens["ci@pve!blind"] = Token("blind-secret", frozenset())
    _configure(project, api)
    text = (project.path / "orch.toml").read_text().replace('token_id = "root@pam!orch"', 'token_id = "ci@pve!blind"')
    (project.path / "orch.toml").write_text(text)
    monkeypatch.setenv("ORCH_PROXMOX_TOKEN", "blind-secret")
    res = project.cli("targets")
    assert res.exit_code == 0, res.output
    assert "sees no containers" in res.stdout


@pytest.mark.parametrize("argv", [["exec", "--ct", "200", "--ct", "201", "--", "true"], ["forward", "8000",
                                  "--ct", "200", "--ct", "201"], ["gc", "--ct", "200", "--target", "local"],
                                  ["checkpoints", "purge", "--ct", "200", "--ct", "201", "--yes"]])
def test_one_node_commands_refuse_several_nodes_instead_of_picking_one(project, api, argv):
    _configure(project, api)
    res = project.run(*argv)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "acts on one node at a time" in res.stderr and "hint: name one of them" in res.stderr


def test_use_with_several_cts_makes_the_job_current(project, api, monkeypatch):
    _configure(project, api)
    monkeypatch.setenv("ORCH_PROXMOX_TOKEN", SECRET)
    res = project.run("use", "--ct", "200", "--ct", "203")
    assert res.returncode == 0, res.stderr
    assert json.loads((project.path / ".orch" / "current-target.json").read_text()) == \
        {"nodes": [{"ct": 200}, {"ct": 203}]}
    shown = project.run("use")
    assert "current target: 2 nodes: CT 200" in shown.stdout and "CT 203" in shown.stdout, shown.stdout
