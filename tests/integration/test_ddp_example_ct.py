"""examples/ddp as a 2-node job on CTs 200 and 201 through the real CLI: planned (--dry-run), trained in sync,
watched (status, experiments show), then resumed.

torch comes from the read-only site folder bind-mounted into both CTs (``torch_cts``); orch is not installed
in the CTs, the example's batches come from the batching library the agent puts on the run's PYTHONPATH.
Checkpoints exist on node 0 only: the second deploy must resume every rank from there.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest

from tests.integration.test_multinode_ct import _log, _until, torch_cts  # noqa: F401  (the fixture)
from tests.integration.test_remote import CKPT, on_ct, remote  # noqa: F401  (the fixture)

pytestmark = pytest.mark.testbed

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ddp"
DONE = re.compile(r"^done step=(\d+) world=2 checksum=([0-9a-f]{16}) params in sync$", re.M)


def _ddp_project(remote) -> None:  # noqa: F811
    for name in ("train.py", "synthetic.py"):
        shutil.copy(EXAMPLE / name, remote.path / name)
    extra = '\n[batching]\nstrategy = "megabatch"\ntoken_budget = 2048\nmax_seq_len = 128\nseed = 0\n'
    remote.write(entries=False, name="ddp", sources='["train.py", "synthetic.py"]', extra=extra)
    toml = remote.path / "orch.toml"
    env = 'env = { OMP_NUM_THREADS = "1", DDP_STEPS = "12", DDP_CKPT_EVERY = "4", DDP_SAMPLES = "600" }'
    toml.write_text("\n".join(env if line.startswith("env = ") else line for line in toml.read_text().splitlines())
                    + "\n")


def _finished(remote, testbed, steps: int) -> tuple[list[str], list[str]]:  # noqa: F811
    """Waits for the job's end; returns each node's log and checksum."""
    data = _until(remote, ("finished", "crashed", "stopped"), 150)
    logs = [_log(testbed, n) for n in data["nodes"]]
    assert [(n["rank"], n["state"], n["exit_code"]) for n in data["nodes"]] == \
        [(0, "finished", 0), (1, "finished", 0)], logs
    sums = []
    for log in logs:
        done = DONE.search(log)
        assert done and int(done.group(1)) == steps, log
        assert "not importable" not in log, log  # orch's BatchSampler, shipped with the agent
        sums.append(done.group(2))
    return logs, sums


def test_the_ddp_example_trains_on_two_cts_and_resumes_from_node_0(remote, testbed, torch_cts):  # noqa: F811
    _ddp_project(remote)
    dry = remote.run("deploy", "--ct", "200", "--ct", "201", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "--rdzv-endpoint=10.77.0.200:29400" in dry.stdout and "--local-addr=10.77.0.201" in dry.stdout
    assert "GLOO_SOCKET_IFNAME=eth0" in dry.stdout and "ORCH_NODE_RANK=1" in dry.stdout
    begin = time.monotonic()
    res = remote.run("deploy", "--ct", "200", "--ct", "201", "-m", "ddp example")
    assert res.returncode == 0, res.stderr
    assert "experiment 1: started on 2 nodes" in res.stdout
    logs, sums = _finished(remote, testbed, 12)
    print(f"12 steps on 2 nodes: {time.monotonic() - begin:.1f} s from the deploy; checksums {sums}")
    assert sums[0] == sums[1]
    assert "step=12 loss=" in logs[0] and "tok/s=" in logs[0]
    assert json.loads((remote.path / ".orch" / "current-target.json").read_text()) == \
        {"nodes": [{"ct": 200}, {"ct": 201}]}
    human = remote.run("status")
    assert "experiment 1 finished" in human.stdout and human.stdout.count("  node ") == 2, human.stdout
    shown = remote.run("experiments", "show", "1")
    assert shown.returncode == 0, shown.stderr
    assert "  node 1 " in shown.stdout and "10.77.0.201: finished (exit code 0)" in shown.stdout, shown.stdout
    assert on_ct(testbed, 200, "ls", CKPT).split() == ["ckpt-000004.pt", "ckpt-000008.pt", "ckpt-000012.pt"]
    assert on_ct(testbed, 201, "sh", "-c", f"ls {CKPT} 2>/dev/null || true").strip() == ""  # rank 0 writes

    begin = time.monotonic()
    res = remote.run("deploy", "--ct", "200", "--ct", "201", "--set", "project.env.DDP_STEPS=18", "-m", "resume")
    assert res.returncode == 0, res.stderr
    logs, resumed = _finished(remote, testbed, 18)
    print(f"resumed to 18 steps: {time.monotonic() - begin:.1f} s from the deploy; checksums {resumed}")
    assert resumed[0] == resumed[1] != sums[0]
    for log in logs:  # node 1 had no checkpoint: it got node 0's state by broadcast
        assert f"resumed from step=12 checkpoint={CKPT}/ckpt-000012.pt (rank 0)" in log, log
        assert "step=13 loss=" in log and "step=12 loss=" not in log, log
    assert "ckpt-000016.pt" in on_ct(testbed, 200, "ls", CKPT)
