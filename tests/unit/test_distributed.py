"""The per-node launch lines of a job over several containers (pure)."""

from __future__ import annotations

from orchestrator.config import DistributedSection
from orchestrator.launch.distributed import NodeFacts, plan, script_args

NODES = [NodeFacts(0, "ct200", "10.77.0.200", "eth0"), NodeFacts(1, "ct201", "10.77.0.201", "eth0", gpus=2)]


def test_torchrun_recipe_per_node():
    runs = plan(NODES, ["python3", "train.py", "--lr", "1"], DistributedSection(), "tinylm", 7)
    assert runs[0].argv == ["python3", "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
                            "--rdzv-backend=c10d", "--rdzv-endpoint=10.77.0.200:29400", "--rdzv-id=tinylm-exp7",
                            "--rdzv-conf=is_host=1", "--local-addr=10.77.0.200", "train.py", "--lr", "1"]
    assert "--rdzv-conf=is_host=0" in runs[1].argv and "--local-addr=10.77.0.201" in runs[1].argv
    assert "--nproc-per-node=2" in runs[1].argv  # auto: the GPUs the node listed
    assert runs[1].env == {"ORCH_NNODES": "2", "ORCH_NODE_RANK": "1", "ORCH_NODE_ADDRS": "10.77.0.200 10.77.0.201",
                           "ORCH_MASTER_ADDR": "10.77.0.200", "ORCH_MASTER_PORT": "29400",
                           "GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0"}


def test_restarts_port_interface_and_fixed_nproc():
    dist = DistributedSection(port=29500, interface="vmbr1", nproc_per_node=4)
    run = plan(NODES, ["python3", "train.py"], dist, "p", 1, restarts=3)[0]
    assert run.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1" and run.env["GLOO_SOCKET_IFNAME"] == "vmbr1"
    assert "--max-restarts=3" in run.argv and "--nproc-per-node=4" in run.argv
    assert "--rdzv-endpoint=10.77.0.200:29500" in run.argv


def test_launcher_none_runs_the_command_with_rank_variables():
    runs = plan(NODES, ["./go.sh"], DistributedSection(launcher="none"), "p", 1)
    assert [r.argv for r in runs] == [["./go.sh"], ["./go.sh"]]
    assert [r.env["ORCH_NODE_RANK"] for r in runs] == ["0", "1"] and "GLOO_SOCKET_IFNAME" not in runs[0].env


def test_one_node_defaults_to_no_launcher():
    assert plan(NODES[:1], ["python3", "t.py"], DistributedSection(), "p", 1)[0].argv == ["python3", "t.py"]


def test_interpreter_word_dropped_or_no_python():
    assert script_args(["python3", "-u", "train.py"]) == ["train.py"]
    assert script_args(["/usr/bin/python3.11", "-m", "pkg.train", "x"]) == ["-m", "pkg.train", "x"]
    assert script_args(["bash", "run.sh"]) == ["--no-python", "bash", "run.sh"]


def test_each_node_is_told_who_its_peers_are_for_the_jobs_stall_watchdog():
    runs = plan(NODES, ["python3", "train.py"], DistributedSection(port=29500), "p", 3)
    assert [r.job for r in runs] == [{"id": "p-exp3", "rank": r, "addrs": ["10.77.0.200", "10.77.0.201"],
                                      "port": 29501} for r in (0, 1)]
    assert plan(NODES, ["x"], DistributedSection(launcher="none", heartbeat_port=7000), "p", 3)[1].job["port"] == 7000
    assert DistributedSection(port=65535).heartbeat == 65534


def test_a_nodes_last_lines_stop_at_torchruns_own_failure_report():
    from orchestrator.launch.distributed import before_launcher_report

    report = ["E1201 12:24:32.345000 57 torch/distributed/elastic/multiprocessing/api.py:882] failed "
              "(exitcode: 3) local_rank: 0 (pid: 68) of binary: /usr/bin/python3", "Traceback (most recent call last):",
              *[f"  File x{i}" for i in range(20)], "crash.py FAILED", "  exitcode  : 3 (pid: 68)", "=" * 60]
    lines = [f"line {i}" for i in range(30)] + ["node 1: out of memory"] + report
    kept, code = before_launcher_report(lines, keep=3)
    assert kept == ["line 29", "node 1: out of memory", report[0]] and code == 3
    assert before_launcher_report(lines[:31], keep=2) == (["line 29", "node 1: out of memory"], None)
