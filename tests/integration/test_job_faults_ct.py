"""A job over CTs 200 and 201 under faults: a node cut off, a node frozen during a stop, a job started
over a single-CT run, a node crashing. Real torchrun (gloo on CPU) for the first, plain processes after."""

from __future__ import annotations

import json
import time

import pytest

from tests.integration.test_multinode_ct import LONG, SILENT, _job_processes, _job_project, _until, \
    _until_steps, torch_cts  # noqa: F401  (the fixture)
from tests.integration.test_remote import on_ct, remote  # noqa: F401  (the fixture)
from tests.testbed import faults

pytestmark = pytest.mark.testbed

READ_TIMEOUT = 5
COMMAND_TIMEOUT = 120  # far above what a bounded read or stop takes: a hang shows as a failure
DIRECT = '\n[targets.n0]\nkind = "proxmox"\nct = 200\naccess = "ssh"\nuser = "root"\n\n' \
         '[targets.n1]\nkind = "proxmox"\nct = 201\naccess = "ssh"\nuser = "root"\n'


def _timeouts(remote) -> None:  # noqa: F811
    toml = remote.path / "orch.toml"
    toml.write_text(toml.read_text().replace(
        "command_timeout = 60\n", f"command_timeout = {COMMAND_TIMEOUT}\nread_timeout = {READ_TIMEOUT}\n", 1))


def _hold_lock(testbed, vmid: int) -> None:  # noqa: F811
    """Holds orch's target lock on CT ``vmid`` (as another orch command would) until ``_release_lock``: that
    node's start waits for it, while the other nodes start."""
    testbed.ct(vmid).attach("sh", "-c", "mkdir -p /workspace/orch && (sh -c 'exec 9>>/workspace/orch/.lock; "
                            "flock 9; exec sleep 600' </dev/null >/dev/null 2>&1 & echo $! > /run/orch-test-lock.pid)"
                            "; until ! flock -n /workspace/orch/.lock true; do sleep 0.05; done")


def _release_lock(testbed, vmid: int) -> None:  # noqa: F811
    testbed.ct(vmid).attach("sh", "-c", 'kill "$(cat /run/orch-test-lock.pid)"; rm -f /run/orch-test-lock.pid')


def test_status_with_node_1_cut_off_and_stop_with_node_1_frozen_return_and_say_so(
        remote, testbed, torch_cts, ct201):  # noqa: F811
    _job_project(remote, "python3 ddp_silent.py", LONG, extra=DIRECT, script=SILENT)
    _timeouts(remote)
    assert remote.run("deploy", "--target", "n0", "--target", "n1").returncode == 0
    _until_steps(testbed, remote.registry().get(1).nodes[:1], 2)
    faults.block("10.77.0.201", 22)
    try:
        begin = time.monotonic()
        res = remote.run("status")
        took = time.monotonic() - begin
    finally:
        faults.clear([])
    print(f"status of a job with node 1 cut off: exit {res.returncode} in {took:.1f} s "
          f"(read_timeout {READ_TIMEOUT} s, command_timeout {COMMAND_TIMEOUT} s)")
    assert res.returncode == 0, res.stderr
    assert took < COMMAND_TIMEOUT / 2, took
    lines = res.stdout.splitlines()
    node0 = next(line for line in lines if line.startswith("  node 0 "))
    node1 = next(line for line in lines if line.startswith("  node 1 "))
    assert ": running" in node0 and "unreachable" not in node0, lines
    assert "[unreachable: " in node1 and ": running" in node1, lines  # its last known state, and why not now

    ct201.freeze()
    try:
        begin = time.monotonic()
        stop = remote.run("stop")
        took = time.monotonic() - begin
        exp = remote.registry().get(1)
    finally:
        ct201.thaw()
    print(f"stop of a job with node 1 frozen: exit {stop.returncode} in {took:.1f} s")
    assert stop.returncode == 3, (stop.stdout, stop.stderr)
    assert took < COMMAND_TIMEOUT / 2, took
    assert "error: node 1 (CT 201" in stop.stderr and "stop not delivered: unreachable" in stop.stderr, stop.stderr
    assert "hint: " in stop.stderr
    assert "  node 0 " in stop.stdout and "stop not delivered" in stop.stdout, stop.stdout
    assert exp.status == "running" and exp.ended is None, (exp.status, exp.nodes)
    assert exp.nodes[0]["state"] == "stopped" and exp.nodes[1]["stop_pending"], exp.nodes
    assert "stop not delivered: unreachable" in exp.nodes[1]["stop"]

    after = remote.run("status")  # node 1 is back: the stop owed to it is delivered, the row settled
    assert after.returncode == 0, after.stderr
    exp = remote.registry().get(1)
    assert exp.status in ("stopped", "crashed"), (exp.status, exp.nodes)
    assert all(n["ended"] is not None and not n.get("stop_pending") for n in exp.nodes), exp.nodes
    assert exp.ended == max(n["ended"] for n in exp.nodes)
    assert exp.end_reason and "node 0 stopped" in exp.end_reason and "node 1 " in exp.end_reason, exp.end_reason
    assert _job_processes(testbed, 201) == "" and _job_processes(testbed, 200) == ""


JOB = """\
import os, sys, time
rank = os.environ.get("ORCH_NODE_RANK")
if rank is None:  # a single-CT run of the same project: runs until stopped
    time.sleep(600)
time.sleep(2 if rank == "1" else 4)
if rank == "1":
    print("node 1: simulated failure", flush=True)
    sys.exit(3)
"""


def test_a_job_over_a_single_ct_run_stops_it_says_so_and_its_row_has_every_nodes_end(remote, testbed):  # noqa: F811
    (remote.path / "job.py").write_text(JOB)
    _job_project(remote, "python3 job.py", 'OMP_NUM_THREADS = "1"',
                 extra=DIRECT + '\n[distributed]\nlauncher = "none"\n')
    toml = remote.path / "orch.toml"
    toml.write_text(toml.read_text().replace('"ddp_tiny.py"]', '"job.py"]'))
    single = remote.run("deploy", "--target", "n1")
    assert single.returncode == 0, single.stderr
    assert remote.registry().get(1).status == "running"
    res = remote.run("deploy", "--target", "n0", "--target", "n1")
    assert res.returncode == 0, res.stderr
    assert "stopped experiment 1 on CT 201" in res.stderr, res.stderr
    old = remote.registry().get(1)
    assert old.status == "stopped" and old.end_reason == "stopped by experiment 2", (old.status, old.end_reason)
    assert old.ended is not None and old.exit_code is not None
    every = remote.run("status", "--all")
    assert every.returncode == 0 and "experiment 1 running" not in every.stdout, every.stdout

    data = _until(remote, ("finished", "crashed", "stopped"), 60)
    assert data["state"] == "crashed" and data["exit_code"] == 3, data
    exp = remote.registry().get(2)
    assert [(n["state"], n["exit_code"]) for n in exp.nodes] == [("finished", 0), ("crashed", 3)], exp.nodes
    ends = [n["ended"] for n in exp.nodes]
    assert all(e is not None for e in ends) and ends[1] < ends[0], ends
    assert exp.ended == ends[0]  # the job ended with its last node, not its first
    assert exp.end_reason == "node 1 crashed (exit code 3); node 0 finished", exp.end_reason
    show = remote.run("experiments", "show", "2")
    assert show.returncode == 0, show.stderr
    assert "node 1 crashed (exit code 3); node 0 finished" in show.stdout, show.stdout
    assert "    1: CT 201" in show.stdout and "crashed (exit code 3)" in show.stdout, show.stdout
    assert "stopped by experiment 2" in remote.run("experiments", "show", "1").stdout


def test_a_job_launch_killed_mid_start_is_settled_from_the_nodes(remote, testbed, ct201):  # noqa: F811
    import subprocess
    import sys

    (remote.path / "job.py").write_text(JOB)
    _job_project(remote, "python3 job.py", 'OMP_NUM_THREADS = "1"',
                 extra=DIRECT + '\n[distributed]\nlauncher = "none"\n')
    toml = remote.path / "orch.toml"
    toml.write_text(toml.read_text().replace('"ddp_tiny.py"]', '"job.py"]'))
    _timeouts(remote)
    _hold_lock(testbed, 201)  # every node starts at once: node 1's start waits for its lock
    deploy = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "deploy", "--target", "n0",
                               "--target", "n1"], cwd=remote.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    begin = time.monotonic()
    try:
        while "train.log" not in testbed.ct(200).attach("sh", "-c", "ls /workspace/orch/runs/*/ 2>/dev/null || true"
                                                        ).stdout.decode():
            assert deploy.poll() is None and time.monotonic() - begin < 60, deploy.communicate()
            time.sleep(0.05)
        ct201.freeze()  # node 0 started; node 1's start cannot be answered
        deploy.kill()  # orch dies before it heard back from every node
        deploy.wait(timeout=10)
    finally:
        ct201.thaw()
        _release_lock(testbed, 201)  # node 1's start, its controller gone, never begins
    assert remote.registry().get(1).status == "launching"
    deadline = time.monotonic() + 60
    while True:  # the job was never remembered as the current target: name its nodes
        res = remote.run("status", "--target", "n0", "--target", "n1", "--json")
        assert res.returncode == 0, res.stderr
        data = json.loads(res.stdout)
        if data["state"] != "running" and data["state"] != "launching":
            break
        assert time.monotonic() < deadline, data
        time.sleep(1)
    exp = remote.registry().get(1)
    assert exp.status == data["state"] and exp.status != "launching", exp.status
    assert exp.nodes[0]["state"] == "finished" and exp.nodes[0]["ended"] is not None, exp.nodes
    assert exp.nodes[1]["state"] in ("failed", "crashed"), exp.nodes
    assert exp.end_reason and "node 0 finished" in exp.end_reason and "node 1 " in exp.end_reason, exp.end_reason
    print(f"interrupted job launch settled: {exp.status}; {exp.end_reason}")


def _live(testbed, vmid: int) -> list[str]:
    """The run folders on CT ``vmid`` and the job processes there (``job.py``), as the CT sees them."""
    folders = on_ct(testbed, vmid, "sh", "-c", "ls /workspace/orch/runs 2>/dev/null || true").split()
    procs = on_ct(testbed, vmid, "sh", "-c", "pgrep -f '[j]ob.py' || true").split()
    return folders + [f"{len(procs)} job process(es)"]


def test_a_deploy_or_restart_onto_one_node_of_a_running_job_is_refused_and_stops_nothing(
        remote, testbed, ct201):  # noqa: F811
    (remote.path / "job.py").write_text(JOB.replace('time.sleep(2 if rank == "1" else 4)', "time.sleep(600)"))
    _job_project(remote, "python3 job.py", 'OMP_NUM_THREADS = "1"',
                 extra=DIRECT + '\n[distributed]\nlauncher = "none"\n')
    toml = remote.path / "orch.toml"
    toml.write_text(toml.read_text().replace('"ddp_tiny.py"]', '"job.py"]'))
    assert remote.run("deploy", "--target", "n1", "-m", "one node").returncode == 0  # what a restart there relaunches
    job = remote.run("deploy", "--target", "n0", "--target", "n1", "-m", "the job")
    assert job.returncode == 0, job.stderr
    before = {vmid: _live(testbed, vmid) for vmid in (200, 201)}
    assert all(b[-1] == "1 job process(es)" for b in before.values()), before
    current = (remote.path / ".orch" / "current-target.json").read_text()
    node = testbed.node.name
    for argv in (("deploy", "--target", "n1", "-m", "again"), ("restart", "--target", "n1")):
        res = remote.run(*argv)
        assert res.returncode == 5, (argv, res.stdout, res.stderr)
        assert (f"error: CT 201 on {node} runs node 1 of experiment 2, a job over 2 nodes "
                f"(CT 200 on {node}, CT 201 on {node}): this {argv[0]} would stop only that node; nothing was "
                "stopped") in res.stderr, res.stderr
        assert "hint: stop the whole job first: orch stop --ct 200 --ct 201" in res.stderr, res.stderr
        assert [e.id for e in remote.registry().list()] == [2, 1], argv  # nothing recorded
        assert {vmid: _live(testbed, vmid) for vmid in (200, 201)} == before, argv  # nothing stopped or started
        assert (remote.path / ".orch" / "current-target.json").read_text() == current
    status = remote.run("status", "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["state"] == "running"
    assert [n["state"] for n in remote.registry().get(2).nodes] == ["running", "running"]

    stop = remote.run("stop", "--ct", "200", "--ct", "201")  # the command the hint names ends the whole job
    assert stop.returncode == 0, stop.stderr
    assert remote.registry().get(2).status == "stopped"
    single = remote.run("restart", "--target", "n1")
    assert single.returncode == 0, single.stderr
    assert remote.registry().get(3).status == "running" and remote.registry().get(3).parent == 1


def _sleeping_job(remote) -> None:
    """A 2-node job whose ranks sleep (no launcher), with the short timeouts of these tests."""
    (remote.path / "job.py").write_text(JOB.replace('time.sleep(2 if rank == "1" else 4)', "time.sleep(600)"))
    _job_project(remote, "python3 job.py", 'OMP_NUM_THREADS = "1"',
                 extra=DIRECT + '\n[distributed]\nlauncher = "none"\n')
    toml = remote.path / "orch.toml"
    toml.write_text(toml.read_text().replace('"ddp_tiny.py"]', '"job.py"]'))
    _timeouts(remote)


def test_a_job_launch_interrupted_by_ctrl_c_mid_start_is_settled_as_running(remote, testbed, ct201):  # noqa: F811
    import signal
    import subprocess
    import sys

    _sleeping_job(remote)
    _hold_lock(testbed, 201)  # every node starts at once: node 1's start waits for its lock
    deploy = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "deploy", "--target", "n0",
                               "--target", "n1"], cwd=remote.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    begin = time.monotonic()
    try:
        while "train.log" not in testbed.ct(200).attach("sh", "-c", "ls /workspace/orch/runs/*/ 2>/dev/null || true"
                                                        ).stdout.decode():
            assert deploy.poll() is None and time.monotonic() - begin < 60, deploy.communicate()
            time.sleep(0.05)
        deploy.send_signal(signal.SIGINT)  # Ctrl-C while orch waits for node 1
        _out, err = deploy.communicate(timeout=10)  # not held up by node 1's start, still waiting for its lock
    finally:
        _release_lock(testbed, 201)  # node 1's start, its controller gone, never begins
    assert deploy.returncode == 130 and b"interrupted" in err, err
    assert remote.registry().get(1).status == "launching"
    res = remote.run("status", "--target", "n0", "--target", "n1", "--json")
    assert res.returncode == 0, res.stderr
    exp = remote.registry().get(1)
    assert exp.status == "running", (exp.status, exp.nodes)  # node 0 runs: the job is not launching any more
    assert exp.nodes[0]["state"] == "running", exp.nodes
    assert json.loads(res.stdout)["state"] == "running"


def test_every_node_starts_at_once_a_node_waiting_for_its_lock_holds_up_no_other(remote, testbed, ct201):  # noqa: F811
    import subprocess
    import sys

    _sleeping_job(remote)
    _hold_lock(testbed, 200)  # node 0's start waits for its lock (lock_timeout 10 s)
    deploy = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "deploy", "--target", "n0",
                               "--target", "n1"], cwd=remote.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        begin = time.monotonic()
        while "1 job process(es)" not in _live(testbed, 201):  # node 1 runs while node 0 still waits
            assert deploy.poll() is None and time.monotonic() - begin < 8, (deploy.communicate(), _live(testbed, 200))
            time.sleep(0.05)
        assert _live(testbed, 200)[-1] == "0 job process(es)"
    finally:
        _release_lock(testbed, 200)
    out, err = deploy.communicate(timeout=60)
    assert deploy.returncode == 0, err
    assert [n["state"] for n in remote.registry().get(1).nodes] == ["running", "running"]
    assert {vmid: _live(testbed, vmid)[-1] for vmid in (200, 201)} == {200: "1 job process(es)",
                                                                       201: "1 job process(es)"}
    assert remote.run("stop").returncode == 0
    assert remote.registry().get(1).status == "stopped"


SLOW_STOP = """\
import pathlib, signal, sys, time
def stopping(*_):  # each rank takes 2 s to stop after its SIGTERM (as one saving its last checkpoint does)
    pathlib.Path("/tmp/orch-test-job-stopping").touch()
    time.sleep(2)
    sys.exit(0)
signal.signal(signal.SIGTERM, stopping)
time.sleep(600)
"""
STOPPING = "test -e /tmp/orch-test-job-stopping && echo yes || true"


def test_a_job_deploy_cut_while_the_old_job_stops_starts_the_new_one_on_every_node(remote, testbed):  # noqa: F811
    """Ctrl-C once the job being replaced is stopping on every node: each node's stop and start are one call, so
    each node finishes its start by itself; orch says so with the command back to the old job, which works."""
    import signal
    import subprocess
    import sys

    _sleeping_job(remote)
    (remote.path / "job.py").write_text(SLOW_STOP)
    first = remote.run("deploy", "--target", "n0", "--target", "n1")
    assert first.returncode == 0, first.stderr
    for vmid in (200, 201):
        on_ct(testbed, vmid, "rm", "-f", "/tmp/orch-test-job-stopping")
    deploy = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "deploy", "--target", "n0",
                               "--target", "n1"], cwd=remote.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    begin = time.monotonic()
    while any(on_ct(testbed, vmid, "sh", "-c", STOPPING) != "yes\n" for vmid in (200, 201)):
        assert deploy.poll() is None and time.monotonic() - begin < 60, deploy.communicate()
        time.sleep(0.05)
    deploy.send_signal(signal.SIGINT)  # both parts of job 1 are stopping: no node has started job 2 yet
    _, err = deploy.communicate(timeout=30)
    print(err)
    assert deploy.returncode == 130, err
    node = testbed.node.name
    assert (f"interrupted: node 0 (CT 200 on {node}), node 1 (CT 201 on {node}) had not answered: each finishes "
            "its start by itself once its part of experiment 1 stopped, or leaves that part running if its stop "
            "had not begun; orch status shows which; to go back: orch restart -e 1") in err, err
    deadline = time.monotonic() + 60
    while True:  # asked at once, while the nodes may still stop job 1: never read as failed, running once started
        res = remote.run("status", "--target", "n0", "--target", "n1", "--json")
        assert res.returncode == 0, res.stderr
        data = json.loads(res.stdout)
        assert data["experiment"] == 2 and data["state"] in ("launching", "running"), data
        if data["state"] == "running" and [n["state"] for n in remote.registry().get(2).nodes] == ["running"] * 2:
            break
        assert time.monotonic() < deadline, data
        time.sleep(0.5)
    assert {vmid: _live(testbed, vmid)[-1] for vmid in (200, 201)} == {200: "1 job process(es)",
                                                                       201: "1 job process(es)"}
    new, old = remote.registry().get(2), remote.registry().get(1)
    assert new.status == "running" and [n["state"] for n in new.nodes] == ["running", "running"], new.nodes
    assert old.status == "stopped" and [n["state"] for n in old.nodes] == ["stopped", "stopped"], old.nodes

    back = remote.run("restart", "-e", "1")  # the command it gave: job 1's revision and command on its nodes
    assert back.returncode == 0, back.stderr
    again = remote.registry().get(3)
    assert (again.parent, again.revision, again.status) == (1, old.revision, "running"), again
    assert [n["state"] for n in again.nodes] == ["running", "running"] and remote.registry().get(2).status == "stopped"
    assert remote.run("stop").returncode == 0
