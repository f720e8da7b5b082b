"""One job over CTs 200 and 201: real torchrun (c10d rendezvous, gloo on CPU), gang start, stop, status.

torch comes from a host folder bind-mounted read-only into both CTs (``tests/testbed/torchsite.py``);
the CTs' /etc/hosts is Proxmox's DHCP shape (``127.0.1.1 ctN``, no peers), which the recipe must survive.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from tests.integration.test_remote import on_ct, remote  # noqa: F401  (the fixture)
from tests.testbed import torchsite

pytestmark = pytest.mark.testbed

DDP = Path(__file__).parent.parent / "data" / "ddp_tiny.py"
RANK = 'import os; print("node", os.environ["ORCH_NODE_RANK"], "of", os.environ["ORCH_NNODES"], ' \
       'os.environ["ORCH_MASTER_ADDR"], os.environ["ORCH_NODE_ADDRS"], flush=True)'


@pytest.fixture
def torch_cts(testbed, ct200, ct201):
    begin = time.monotonic()
    site = torchsite.ensure_site()
    installed = time.monotonic() - begin
    begin = time.monotonic()
    for ct in (ct200, ct201):
        torchsite.mount(ct, site)
    print(f"torch site ready in {installed:.1f} s; mounted in both CTs in {time.monotonic() - begin:.1f} s")
    yield
    for ct in (ct200, ct201):
        torchsite.unmount(ct, site)


def _job_project(remote, command: str, env: str, extra: str = "") -> None:  # noqa: F811
    shutil.copy(DDP, remote.path / "ddp_tiny.py")
    remote.write(entries=False, sources='["train.py", "ddp_tiny.py"]', extra=extra)
    toml = remote.path / "orch.toml"
    text = toml.read_text().replace('command = "python3 train.py"', f"command = {json.dumps(command)}")
    lines = [f"env = {{ {env} }}" if line.startswith("env = ") else line for line in text.splitlines()]
    toml.write_text("\n".join(lines) + "\n")


def _status(remote) -> dict:  # noqa: F811
    res = remote.run("status", "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _until(remote, states: tuple[str, ...], timeout: float) -> dict:  # noqa: F811
    deadline = time.monotonic() + timeout
    while True:
        data = _status(remote)
        if data["state"] in states:
            return data
        assert time.monotonic() < deadline, data
        time.sleep(1)


def _log(testbed, node: dict) -> str:
    return on_ct(testbed, node["ct"], "cat", f"{node['run_dir']}/train.log")


def test_a_two_node_torchrun_job_trains_and_finishes(remote, testbed, torch_cts):  # noqa: F811
    _job_project(remote, "python3 ddp_tiny.py", 'OMP_NUM_THREADS = "1", DDP_STEPS = "5"')
    dry = remote.run("deploy", "--ct", "200", "--ct", "201", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "--rdzv-endpoint=10.77.0.200:29400" in dry.stdout and "--local-addr=10.77.0.201" in dry.stdout
    assert "GLOO_SOCKET_IFNAME=eth0" in dry.stdout and "ORCH_NODE_RANK=1" in dry.stdout
    begin = time.monotonic()
    res = remote.run("deploy", "--ct", "200", "--ct", "201", "-m", "ddp")
    assert res.returncode == 0, res.stderr
    launched = time.monotonic() - begin
    assert "experiment 1: started on 2 nodes" in res.stdout
    data = _until(remote, ("finished", "crashed"), 180)
    print(f"deploy of 2 nodes {launched:.1f} s; finished {time.monotonic() - begin:.1f} s after the deploy began")
    nodes = data["nodes"]
    print("node runs (launcher start to exit):", [f"{n['ended'] - n['started']:.1f} s" for n in nodes])
    assert data["state"] == "finished", [(n["state"], n["exit_code"]) for n in nodes]
    assert [(n["rank"], n["state"], n["exit_code"]) for n in nodes] == [(0, "finished", 0), (1, "finished", 0)]
    for node in nodes:
        log = _log(testbed, node)
        assert f"step=5 " in log and "world=2" in log and "params in sync" in log, log
    assert json.loads((remote.path / ".orch" / "current-target.json").read_text()) == \
        {"nodes": [{"ct": 200}, {"ct": 201}]}
    human = remote.run("status")
    assert "experiment 1 finished" in human.stdout and human.stdout.count("  node ") == 2, human.stdout


def test_stop_mid_run_ends_every_launcher(remote, testbed, torch_cts):  # noqa: F811
    _job_project(remote, "python3 ddp_tiny.py", 'OMP_NUM_THREADS = "1", DDP_STEPS = "100000", DDP_SLEEP = "0.2"')
    res = remote.run("deploy", "--ct", "200", "--ct", "201")
    assert res.returncode == 0, res.stderr
    nodes = remote.registry().get(1).nodes
    deadline = time.monotonic() + 90
    while not all("step=2 " in _log(testbed, n) for n in nodes):
        assert time.monotonic() < deadline, [_log(testbed, n) for n in nodes]
        time.sleep(0.5)
    begin = time.monotonic()
    stop = remote.run("stop")  # bare: the job's nodes are the current target
    assert stop.returncode == 0, stop.stderr
    print(f"stop of 2 nodes: {time.monotonic() - begin:.1f} s")
    assert "experiment 1 on 2 nodes" in stop.stdout and ": stopped" in stop.stdout
    exp = remote.registry().get(1)
    assert exp.status == "stopped" and [n["state"] for n in exp.nodes] == ["stopped", "stopped"]
    for vmid in (200, 201):
        left = on_ct(testbed, vmid, "sh", "-c", "pgrep -f '[t]orch.distributed.run|[d]dp_tiny' || true")
        assert left.strip() == "", (vmid, left)


def test_launcher_none_and_a_group_target(remote, testbed):  # noqa: F811
    group = '\n[targets.a]\nkind = "proxmox"\nct = 200\n\n[targets.b]\nkind = "proxmox"\nct = 201\n\n' \
            '[targets.pair]\nkind = "group"\nmembers = ["a", "b"]\n\n[distributed]\nlauncher = "none"\n'
    _job_project(remote, f"python3 -c {json.dumps(RANK)}", 'OMP_NUM_THREADS = "1"', extra=group)
    res = remote.run("deploy", "--target", "pair")
    assert res.returncode == 0, res.stderr
    data = _until(remote, ("finished", "crashed"), 60)
    assert [(n["state"], n["exit_code"]) for n in data["nodes"]] == [("finished", 0), ("finished", 0)]
    for rank, node in enumerate(data["nodes"]):
        assert f"node {rank} of 2 10.77.0.200 10.77.0.200 10.77.0.201" in _log(testbed, node)
    assert json.loads((remote.path / ".orch" / "current-target.json").read_text()) == {"target": "pair"}


def test_a_node_failing_preflight_starts_nothing_anywhere(remote, testbed, ct201):  # noqa: F811
    _job_project(remote, f"python3 -c {json.dumps(RANK)}", 'OMP_NUM_THREADS = "1"',
                 extra='\n[distributed]\nlauncher = "none"\n')
    ct201.attach("mv", "/usr/bin/tmux", "/usr/bin/tmux.off")
    res = remote.run("deploy", "--ct", "200", "--ct", "201")
    assert res.returncode != 0
    assert "node 1 (CT 201" in res.stderr and "tmux is not installed" in res.stderr
    assert "nothing was started on any node" in res.stderr
    exp = remote.registry().get(1)
    assert exp.status == "failed" and "node 1 (CT 201" in exp.error
    assert on_ct(testbed, 200, "sh", "-c", "ls /workspace/orch/runs 2>/dev/null || true").strip() == ""
