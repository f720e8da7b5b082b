"""One job over CTs 200 and 201: real torchrun (c10d rendezvous, gloo on CPU), gang start, stop, status.

torch comes from a host folder bind-mounted read-only into both CTs (``tests/testbed/torchsite.py``);
the CTs' /etc/hosts is Proxmox's DHCP shape (``127.0.1.1 ctN``, no peers), which the recipe must survive.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import run_on_pty
from tests.integration.test_remote import on_ct, remote  # noqa: F401  (the fixture)
from tests.testbed import torchsite
from tests.waits import wait_for

pytestmark = pytest.mark.testbed

DDP = Path(__file__).parent.parent / "data" / "ddp_tiny.py"
SILENT = Path(__file__).parent.parent / "data" / "ddp_silent.py"  # node 0 prints each step, node 1 nothing
RANK = 'import os; print("node", os.environ["ORCH_NODE_RANK"], "of", os.environ["ORCH_NNODES"], ' \
       'os.environ["ORCH_MASTER_ADDR"], os.environ["ORCH_NODE_ADDRS"], flush=True)'


@pytest.fixture
def torch_cts(testbed, ct_pair):
    from concurrent.futures import ThreadPoolExecutor

    begin = time.monotonic()
    site = torchsite.ensure_site()
    installed = time.monotonic() - begin
    begin = time.monotonic()
    with ThreadPoolExecutor(len(ct_pair)) as pool:  # each CT restarts with the mount: both at once
        list(pool.map(lambda ct: torchsite.mount(ct, site), ct_pair))
    print(f"torch site ready in {installed:.1f} s; mounted in both CTs in {time.monotonic() - begin:.1f} s")
    yield
    for ct in ct_pair:
        torchsite.unmount(ct, site)


def _job_project(remote, command: str, env: str, extra: str = "", script: Path = DDP) -> None:  # noqa: F811
    shutil.copy(script, remote.path / script.name)
    remote.write(entries=False, sources=f'["train.py", "{script.name}"]', extra=extra)
    toml = remote.path / "orch.toml"
    text = toml.read_text().replace('command = "python3 train.py"', f"command = {json.dumps(command)}")
    lines = [f"env = {{ {env} }}" if line.startswith("env = ") else line for line in text.splitlines()]
    toml.write_text("\n".join(lines) + "\n")


def _status(remote) -> dict:  # noqa: F811
    res = remote.run("status", "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _on_host(testbed, vmid: int, path: str) -> Path:
    """A file a run wrote in CT ``vmid``, read from the host through the CT's overlay (no process in the CT)."""
    return testbed.ct(vmid).delta / path.lstrip("/")


def _until_a_node_ended(remote, deadline: float) -> None:  # noqa: F811
    """Wait, without starting a process, until a node of the newest job has written its exit code: polling
    `orch status` all along would take CPU from the job's own processes on a small machine."""
    newest = max(remote.rows(), key=lambda e: e.id, default=None)
    ends = [_on_host(remote.testbed, n["ct"], f"{n['run_dir']}/exit.json")
            for n in (newest and newest.nodes) or [] if n.get("ct") and n.get("run_dir")]
    while ends and not any(end.exists() for end in ends) and time.monotonic() < deadline:
        time.sleep(0.1)


def _until(remote, states: tuple[str, ...], timeout: float) -> dict:  # noqa: F811
    deadline = time.monotonic() + timeout
    if set(states) <= {"finished", "crashed", "stopped"}:
        _until_a_node_ended(remote, deadline)
    while True:
        data = _status(remote)
        if data["state"] in states:
            return data
        assert time.monotonic() < deadline, data
        time.sleep(0.5)


def _log(testbed, node: dict) -> str:
    return on_ct(testbed, node["ct"], "cat", f"{node['run_dir']}/train.log")


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


AFTER_START = """name: deploy
steps:
  - step: preflight
  - step: push_revision
  - step: stop_run
  - step: checkpoints
  - step: record
  - step: start_run
  - step: shell
    argv: ["sh", "-c", "test ! -e /etc/orch-test-fail-after-start"]
  - step: verify_started
"""


def test_a_node_whose_start_fails_after_its_run_started_has_that_run_stopped_too(remote, testbed, ct201):  # noqa: F811
    """Node 1's locked call fails after its run started (as when its answer is lost): the job is failed, and its
    run is stopped on both nodes, that node's too, never left running beside a failed row."""
    _job_project(remote, "sleep 600", 'OMP_NUM_THREADS = "1"', extra='\n[distributed]\nlauncher = "none"\n')
    (remote.path / "playbooks").mkdir(exist_ok=True)
    (remote.path / "playbooks" / "deploy.yaml").write_text(AFTER_START)
    ct201.attach("touch", "/etc/orch-test-fail-after-start")
    try:
        res = remote.run("deploy", "--ct", "200", "--ct", "201")
    finally:
        ct201.attach("rm", "-f", "/etc/orch-test-fail-after-start")
    assert res.returncode != 0, res.stdout
    exp = remote.registry().get(1)
    assert exp.status == "failed" and "node 1 (CT 201" in exp.error
    for vmid in (200, 201):  # each node's run has ended: its command started and was stopped, or the stop came
        # before its supervisor (a Python start, when no standby waits) had started it, and it never will
        run_dir = f"/workspace/orch/runs/{remote.run_key(1)}"
        ended = json.loads(on_ct(testbed, vmid, "cat", f"{run_dir}/exit.json"))
        started = on_ct(testbed, vmid, "sh", "-c", f"test -e {run_dir}/pid.json && echo yes || echo no").strip()
        assert started == "yes" or ended.get("error") == "stopped before its command started", (vmid, ended)
        assert on_ct(testbed, vmid, "sh", "-c", "pgrep -af '[s]leep 600' || true").strip() == "", vmid
    assert "node 1 (CT 201" in res.stderr and "the job was stopped on every node that answered" in res.stderr, \
        res.stderr


def _until_steps(testbed, nodes: list[dict], step: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    logs = [_on_host(testbed, n["ct"], f"{n['run_dir']}/train.log") for n in nodes]
    while not all(log.exists() and f"step={step} " in log.read_text(errors="replace") for log in logs):
        assert time.monotonic() < deadline, [_log(testbed, n)[-500:] for n in nodes]
        time.sleep(0.2)


def _job_processes(testbed, vmid: int) -> str:
    return on_ct(testbed, vmid, "sh", "-c", "pgrep -af '[t]orch.distributed.run|[d]dp_tiny' || true").strip()


LONG = 'OMP_NUM_THREADS = "1", DDP_STEPS = "100000", DDP_SLEEP = "0.2"'


def test_bare_restart_clean_checkpoints_relaunches_the_job_logs_merge_and_stop_ends_it(
        remote, testbed, torch_cts):  # noqa: F811
    _job_project(remote, "python3 ddp_tiny.py", LONG)
    assert remote.run("deploy", "--ct", "200", "--ct", "201").returncode == 0
    _until_steps(testbed, remote.registry().get(1).nodes, 2)
    for vmid in (200, 201):  # what an earlier run of the job left in each node's checkpoint folder
        on_ct(testbed, vmid, "sh", "-c", f"mkdir -p /workspace/checkpoints && echo ckpt-{vmid} "
                                         "> /workspace/checkpoints/step-2.pt")
    node = testbed.node.name  # bare, on a terminal: the job is the current target, and each node's folder is asked
    argv = [sys.executable, "-m", "orchestrator.cli.main", "restart", "--clean-checkpoints", "-m", "again"]
    code, screen = run_on_pty(argv, remote.path, {f"on CT 200 on {node}?": "y", f"on CT 201 on {node}?": "y"})
    assert code == 0, screen
    assert "experiment 2: started on 2 nodes" in screen and screen.count("checkpoints moved to") == 2, screen
    reg = remote.registry()
    old, new = reg.get(1), reg.get(2)
    assert old.status == "stopped" and [n["state"] for n in old.nodes] == ["stopped", "stopped"], old.nodes
    assert new.status == "running" and new.parent == 1 and new.message == "again"
    assert new.checkpoints_action == "moved" and new.revision == old.revision
    for vmid, node in zip((200, 201), new.nodes):
        assert on_ct(testbed, vmid, "ls", "-A", "/workspace/checkpoints").strip() == ""
        assert on_ct(testbed, vmid, "cat", f"{node['checkpoints_entry']}/step-2.pt").strip() == f"ckpt-{vmid}"
    _until_steps(testbed, new.nodes, 3)
    running = _status(remote)
    assert all(n["metrics"].get("step", 0) >= 3 and "loss" in n["metrics"] for n in running["nodes"]), running
    merged = remote.run("logs", "-n", "3")
    assert merged.returncode == 0, merged.stderr
    lines = merged.stdout.splitlines()
    assert {line[:4] for line in lines} == {"[0] ", "[1] "} and len(lines) == 6, merged.stdout
    assert all("step=" in line and f"node={line[1]}" in line for line in lines), merged.stdout
    one = remote.run("logs", "-n", "2", "--node", "1")
    assert one.returncode == 0 and len(one.stdout.splitlines()) == 2 and "node=1" in one.stdout, one.stdout
    bad = remote.run("logs", "--node", "5")
    assert bad.returncode != 0 and "--node 5" in bad.stderr and "0 to 1" in bad.stderr
    every = remote.run("status", "--all")
    assert every.returncode == 0 and "experiment 2 running" in every.stdout and "  node 1 " in every.stdout, \
        every.stdout
    begin = time.monotonic()
    stop = remote.run("stop")  # bare, mid-run: every launcher of the job ends
    assert stop.returncode == 0, stop.stderr
    print(f"stop of 2 nodes: {time.monotonic() - begin:.1f} s")
    assert "experiment 2 on 2 nodes" in stop.stdout and ": stopped" in stop.stdout, stop.stdout
    exp = remote.registry().get(2)
    assert exp.status == "stopped" and [n["state"] for n in exp.nodes] == ["stopped", "stopped"], exp.nodes
    for vmid in (200, 201):
        assert _job_processes(testbed, vmid) == "", vmid


def test_kill_9_on_one_node_brings_the_job_down_everywhere(remote, testbed, torch_cts):  # noqa: F811
    _job_project(remote, "python3 ddp_tiny.py", LONG)
    assert remote.run("deploy", "--ct", "200", "--ct", "201").returncode == 0
    nodes = remote.registry().get(1).nodes
    _until_steps(testbed, nodes, 2)
    follower = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "logs", "--follow", "-n", "1"],
                                cwd=remote.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = ""
    deadline = time.monotonic() + 60
    while not ("[0] step=" in seen and "[1] step=" in seen):  # the follower is reading both nodes
        assert time.monotonic() < deadline and follower.poll() is None, seen
        seen += follower.stdout.readline()
    begin = time.monotonic()
    on_ct(testbed, 201, "pkill", "-9", "-f", "[d]dp_tiny.py")  # no controller involved from here on
    while _job_processes(testbed, 200) or _job_processes(testbed, 201):
        assert time.monotonic() - begin < 10, (_job_processes(testbed, 200), _job_processes(testbed, 201))
        time.sleep(0.2)
    print(f"node 1's worker killed -> every process of the job gone in {time.monotonic() - begin:.1f} s")
    out, err = follower.communicate(timeout=60)
    out = seen + out
    assert follower.returncode == 0, err
    assert "[0] step=" in out and "[1] step=" in out, out
    assert "experiment 1 crashed" in err, err
    data = _status(remote)
    assert data["state"] == "crashed", data
    codes = [n["exit_code"] for n in data["nodes"]]
    assert all(c not in (None, 0) for c in codes), data["nodes"]


def _stall_after(remote, seconds: int) -> None:  # noqa: F811
    toml = remote.path / "orch.toml"
    toml.write_text(toml.read_text().replace("[run]\n", f"[run]\nstall_after = {seconds}\n", 1))


def _job_line(remote) -> list[str]:  # noqa: F811
    res = remote.run("status")
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()


def test_a_silent_node_of_a_moving_job_is_not_stalled_and_trains_to_the_end(remote, testbed, torch_cts):  # noqa: F811
    _job_project(remote, "python3 ddp_silent.py", 'OMP_NUM_THREADS = "1", DDP_STEPS = "120", DDP_SLEEP = "0.25"',
                 script=SILENT)
    _stall_after(remote, 20)  # above the start-up on a loaded machine; node 1 is silent for half as long again
    assert remote.run("deploy", "--ct", "200", "--ct", "201").returncode == 0
    nodes = remote.registry().get(1).nodes
    _until_steps(testbed, nodes[:1], 40)
    time.sleep(2)
    lines = _job_line(remote)
    assert "running; the job moved" in lines[0], lines
    assert "no output (node 1 prints nothing; the job moves)" in lines[2] or "while the job moves" in lines[2], lines
    assert "last line" not in lines[2] and "heartbeat" not in lines[2], lines
    data = _until(remote, ("finished", "crashed", "stopped"), 120)
    assert data["state"] == "finished", [(n["state"], n.get("reason")) for n in data["nodes"]]
    assert [(n["state"], n["exit_code"]) for n in data["nodes"]] == [("finished", 0), ("finished", 0)], data
    node1 = _log(testbed, data["nodes"][1])
    assert "step=" not in node1 and "stalled" not in node1, node1[-800:]
    assert "step=120 " in _log(testbed, data["nodes"][0])
    beat = json.loads(on_ct(testbed, 201, "cat", f"{data['nodes'][1]['run_dir']}/job.json"))
    assert beat["error"] is None and beat["peers"]["0"]["size"] > 0, beat  # what node 1's watchdog heard
    run = data["nodes"][1]
    print(f"node 1 silent for {run['ended'] - run['started']:.0f} s with stall_after 20 s: finished")
    assert run["ended"] - run["started"] > 30


def test_a_frozen_node_is_noticed_by_the_stall_watchdog(remote, testbed, torch_cts, ct201):  # noqa: F811
    _job_project(remote, "python3 ddp_silent.py", LONG, script=SILENT)  # node 1, the one frozen, is silent anyway
    _stall_after(remote, 20)
    assert remote.run("deploy", "--ct", "200", "--ct", "201").returncode == 0
    nodes = remote.registry().get(1).nodes
    _until_steps(testbed, nodes[:1], 2)
    ct201.freeze()
    note = "no new log line on any node of the job for 20 s"
    try:
        begin = time.monotonic()
        while _job_processes(testbed, 200):
            assert time.monotonic() - begin < 60, _log(testbed, nodes[0])[-800:]
            time.sleep(0.5)
        print(f"node 1 frozen -> node 0 down in {time.monotonic() - begin:.1f} s (stall_after 20 s)")
        while note not in _log(testbed, nodes[0]):  # its supervisor says so as it ends
            assert time.monotonic() - begin < 70, _log(testbed, nodes[0])[-800:]
            time.sleep(0.5)
    finally:
        ct201.thaw()
    begin = time.monotonic()
    while _job_processes(testbed, 201):  # thawed: its rendezvous store is gone
        assert time.monotonic() - begin < 60, _job_processes(testbed, 201)
        time.sleep(0.5)
    data = _status(remote)
    assert data["state"] == "crashed", data
    assert data["nodes"][0]["reason"] == "stalled", data["nodes"]
    human = remote.run("status").stdout
    assert "[stalled]" in human, human


CRASH = 'import os, sys, time\nif os.environ["ORCH_NODE_RANK"] == "1":\n    time.sleep(3)\n' \
        '    print("node 1: simulated CUDA out of memory", flush=True)\n    sys.exit(3)\ntime.sleep(120)\n'


def test_deploy_wait_of_a_job_fails_when_a_node_crashes_during_the_wait(remote, testbed, torch_cts):  # noqa: F811
    (remote.path / "crash.py").write_text(CRASH)
    _job_project(remote, "python3 crash.py", 'OMP_NUM_THREADS = "1"')
    text = (remote.path / "orch.toml").read_text().replace('"ddp_tiny.py"]', '"crash.py"]')
    (remote.path / "orch.toml").write_text(text)
    begin = time.monotonic()
    res = remote.run("deploy", "--ct", "200", "--ct", "201", "--wait=60")
    took = time.monotonic() - begin
    print(f"deploy --wait of a job whose node 1 crashes after 3 s: exit {res.returncode} in {took:.1f} s")
    assert res.returncode == 1, (res.stdout, res.stderr)
    assert "error: experiment 1: node 1 (CT 201" in res.stderr and "crashed" in res.stderr, res.stderr
    assert "  | node 1: simulated CUDA out of memory" in res.stderr, res.stderr  # above torchrun's own report
    assert "its worker exited with 3" in res.stderr, res.stderr
    assert "hint: orch logs -e 1 --node 1" in res.stderr, res.stderr
    exp = remote.registry().get(1)
    assert exp.nodes[1]["state"] == "crashed", exp.nodes


WRITER = """\
import os, sys, time
rank = os.environ["ORCH_NODE_RANK"]
release = os.path.join(os.environ["ORCH_RUN_DIR"], "release")
for i in range(20000):
    sys.stdout.write(f"node={rank} line={i} pad={'x' * (i % 40)}\\n")
    if i % 400 == 0:
        sys.stdout.flush()
        time.sleep(0.05)
    if i == 10000:  # half way, the run waits for the test: its cuts land while both nodes are still writing
        sys.stdout.flush()
        deadline = time.monotonic() + 300
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.1)
"""


def test_merged_follow_across_a_cut_to_one_node_loses_and_repeats_nothing(remote, testbed):  # noqa: F811
    (remote.path / "writer.py").write_text(WRITER)
    proxy = testbed.proxy("10.77.0.201", 22)  # node 1 is reached through a proxy the test kills
    host_key = testbed.ct(201).host_key_line.split(" ", 1)[1]
    remote.write(sources='["train.py", "writer.py"]', extra=f'\n[targets.cut1]\nkind = "proxmox"\nct = 201\n'
                 f'address = "127.0.0.1"\nport = {proxy.port}\n\n[distributed]\nlauncher = "none"\n')
    remote.known_hosts.write_text(remote.known_hosts.read_text() + f"[127.0.0.1]:{proxy.port} {host_key}\n")
    toml = remote.path / "orch.toml"
    toml.write_text(toml.read_text().replace('command = "python3 train.py"', 'command = "python3 writer.py"'))
    res = remote.run("deploy", "--target", "ct200", "--target", "cut1")
    assert res.returncode == 0, res.stderr
    follower = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "logs", "-f", "-n", "100000"],
                                cwd=remote.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: follower.stdout.read(65536), b"")))
    reader.start()
    nodes = remote.registry().get(1).nodes
    # line 8000: the follower's own output buffer may still hold the last lines before the nodes' pause
    halfway = [f"[{rank}] node={rank} line=8000 ".encode() for rank in (0, 1)]
    wait_for(lambda: all(mark in b"".join(chunks) for mark in halfway), timeout=120, what="both nodes half way",
             describe=lambda: f"the follower printed, at its end: {b''.join(chunks)[-400:]!r}")
    for _ in range(2):  # both nodes wait half way until released: the cuts land while the job is still going
        proxy.stall()
        time.sleep(0.8)
        proxy.kill()
        time.sleep(1.0)
    for rank, vmid in ((0, 200), (1, 201)):
        testbed.ct(vmid).attach("touch", f"{nodes[rank]['run_dir']}/release")
    follower.wait(timeout=180)
    err = follower.stderr.read().decode()
    reader.join(timeout=30)
    assert follower.returncode == 0, err
    assert "node 1: connection lost" in err and "node 0: connection lost" not in err, err
    out = b"".join(chunks).splitlines(keepends=True)
    for rank, vmid in ((0, 200), (1, 201)):
        mine = b"".join(line[4:] for line in out if line.startswith(f"[{rank}] ".encode()))
        full = testbed.ct(vmid).attach("cat", f"{nodes[rank]['run_dir']}/train.log").stdout
        assert mine == full, (rank, len(mine), len(full))
    assert len(out) == 40000 + sum(1 for line in out if not line.startswith((b"[0] node=", b"[1] node="))), \
        [line for line in out if not line.startswith((b"[0] node=", b"[1] node="))][:5]


def test_a_push_failing_on_one_node_starts_nothing_anywhere(remote, testbed, ct201):  # noqa: F811
    import hashlib

    _job_project(remote, f"python3 -c {json.dumps(RANK)}", 'OMP_NUM_THREADS = "1"',
                 extra='\n[distributed]\nlauncher = "none"\n')
    body = f"# a file only this deploy sends {time.time()}\n".encode()
    (remote.path / "ddp_tiny.py").write_bytes(body)
    sha = hashlib.sha256(body).hexdigest()
    ct201.attach("mkdir", "-p", f"/workspace/orch/blobs/.part-{sha}")  # node 1 cannot write this blob
    res = remote.run("deploy", "--ct", "200", "--ct", "201")
    assert res.returncode != 0
    assert "node 1 (CT 201" in res.stderr and "nothing was started on any node" in res.stderr, res.stderr
    exp = remote.registry().get(1)
    assert exp.status == "failed" and "node 1 (CT 201" in exp.error
    for vmid in (200, 201):
        assert on_ct(testbed, vmid, "sh", "-c", "ls /workspace/orch/runs 2>/dev/null || true").strip() == ""
