"""The queue in a real LXC container: queued experiments start in order with no orch command in between (the test
reads the CT's files), and the queue goes on after the CT is stopped and started again."""

from __future__ import annotations

import json
import time

import pytest

from tests.integration.test_recover_ct import REBOOTS, _reboot, _systemd_or_skip
from tests.integration.test_remote import ROOT, on_ct, remote, wait_state  # noqa: F401 (fixture)

pytestmark = pytest.mark.testbed

CT = ["--ct", "200"]

# a step every 0.1 s up to step 80, a checkpoint every 5; resumes from the step saved in ORCH_RESUME_FROM
JOB = """\
import os, pathlib, time
ck = pathlib.Path(os.environ["ORCH_CHECKPOINT_DIR"])
src = os.environ.get("ORCH_RESUME_FROM")
begin = int(pathlib.Path(src).read_text()) if src and os.environ["ORCH_ATTEMPT"] != "0" else 0
print(f"experiment {os.environ['ORCH_EXPERIMENT_ID']} attempt {os.environ['ORCH_ATTEMPT']} from step {begin}",
      flush=True)
for step in range(begin, 80):
    print(f"step={step} loss=1.0", flush=True)
    if step % 5 == 0:
        (ck / f"ckpt-{step:06d}.pt").write_text(str(step))
    time.sleep(0.1)
"""


def _deploy(remote, *args: str) -> dict:
    (remote.path / "job.py").write_text(JOB)
    res = remote.cli("deploy", *CT, "--json", "--set", "project.sources=['job.py']",
                     "--set", "project.command=python3 job.py", *args)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _run_file(remote, testbed, exp_id: int, name: str) -> dict | None:
    text = on_ct(testbed, 200, "sh", "-c", f"cat {ROOT}/runs/{remote.run_key(exp_id)}/{name} 2>/dev/null || true")
    return json.loads(text) if text.strip() else None


def _wait_file(remote, testbed, exp_id: int, name: str, timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while (found := _run_file(remote, testbed, exp_id, name)) is None:
        assert time.monotonic() < deadline, f"experiment {exp_id} wrote no {name}"
        time.sleep(0.3)
    return found


def test_queued_experiments_start_in_order_in_the_ct(remote, testbed):
    assert _deploy(remote)["experiment"]["status"] == "running"
    second = _deploy(remote, "--queue")
    assert second["experiment"]["status"] == "queued" and second["queue"]["position"] == 1
    assert _deploy(remote, "--queue")["queue"]["position"] == 2
    ended = [_wait_file(remote, testbed, i, "exit.json")["ended"] for i in (1, 2, 3)]  # no orch command meanwhile
    started = [_run_file(remote, testbed, i, "pid.json")["started"] for i in (1, 2, 3)]
    assert ended[0] <= started[1] <= ended[1] <= started[2], (started, ended)
    assert started[2] - ended[1] < 5
    queue = on_ct(testbed, 200, "sh", "-c", f"ls {ROOT}/queue/tinylm/*.json 2>/dev/null || true")
    assert queue.strip() == ""
    wait_state(remote, CT, ("finished",))
    listed = json.loads(remote.cli("experiments", "list", "--json").stdout)
    assert [(e["id"], e["status"]) for e in listed] == [(3, "finished"), (2, "finished"), (1, "finished")]


@REBOOTS
def test_a_queue_goes_on_after_the_ct_restarts(remote, testbed, graceful):
    """With resume_after_reboot the running experiment resumes first and the queue follows it; without it the
    experiment is lost and the queue's own unit starts the next one at boot."""
    _deploy(remote, "--set", "run.resume_after_reboot=true")
    wait_state(remote, CT, ("running",))
    _systemd_or_skip(remote, testbed)
    _deploy(remote, "--queue")
    _deploy(remote, "--queue")
    assert "orch-resume-" in on_ct(testbed, 200, "ls", "/etc/systemd/system")
    _reboot(remote, testbed, graceful)
    # no orch command from here: the resumed experiment 1 ends, then 2 starts and ends, then 3
    ended = [_wait_file(remote, testbed, i, "exit.json", timeout=120)["ended"] for i in (1, 2, 3)]
    started = [_run_file(remote, testbed, i, "pid.json")["started"] for i in (2, 3)]
    assert ended[0] <= started[0] <= ended[1] <= started[1], (started, ended)
    attempts = _run_file(remote, testbed, 1, "attempts.json")
    assert len(attempts["attempts"]) == 2, attempts  # experiment 1 resumed after the boot, before the queue went on
    log = on_ct(testbed, 200, "cat", f"{ROOT}/runs/{remote.run_key(1)}/train.log")
    assert "experiment 1 attempt 1 from step" in log and "step=79 " in log
    assert "orch-resume-" not in on_ct(testbed, 200, "ls", "/etc/systemd/system")  # the queue's unit is gone too


def test_a_queue_whose_running_experiment_is_lost_goes_on_at_boot(remote, testbed):
    _deploy(remote)
    wait_state(remote, CT, ("running",))
    _systemd_or_skip_queue(remote, testbed)
    _deploy(remote, "--queue")
    testbed.stop(200)
    testbed.start(200)
    started = _wait_file(remote, testbed, 2, "pid.json", timeout=60)  # the queue's unit, at boot
    assert _run_file(remote, testbed, 1, "exit.json") is None  # experiment 1 was lost, never ended
    _wait_file(remote, testbed, 2, "exit.json")
    assert started["started"] > 0
    data = wait_state(remote, CT, ("finished",))
    assert data["experiment"] == 2
    show = json.loads(remote.cli("experiments", "show", "1", "--json").stdout)
    assert show["status"] == "lost", show


def _systemd_or_skip_queue(remote, testbed) -> None:
    if on_ct(testbed, 200, "sh", "-c", "test -d /run/systemd/system && echo yes || echo no").strip() != "yes":
        pytest.skip("the CT image does not run systemd")


def test_a_sweep_spread_over_two_cts_ends_each_variant_at_its_budget(remote, testbed):
    lengths = remote.path / "lengths.txt"
    from tests.cli.test_sweep import _tinylm

    lengths.write_text("\n".join(str(int(n)) for n in _tinylm().make_data(600, 512)[0]) + "\n")
    remote.write(sleep=0.0, extra='[batching]\nstrategy = "megabatch"\ntoken_budget = 4096\nmax_seq_len = 512\n'
                                  'seed = 0\nlengths = "lengths.txt"\n')
    res = remote.cli("sweep", "--set", "batching.strategy=sorted,shuffle,bucketed", "--steps", "30",
                     "--ct", "200", "--ct", "201", "--json")
    assert res.exit_code == 0, res.output
    launched = json.loads(res.stdout)
    assert [(v["id"], "200" in v["target"], v["status"]) for v in launched["variants"]] == \
        [(1, True, "running"), (2, False, "running"), (3, True, "queued")], launched
    for exp_id, vmid in ((1, 200), (2, 201), (3, 200)):  # no orch command meanwhile: the CTs' files
        deadline = time.monotonic() + 120
        path = f"{ROOT}/runs/{remote.run_key(exp_id)}/budget.json"
        while not on_ct(testbed, vmid, "sh", "-c", f"cat {path} 2>/dev/null || true").strip():
            assert time.monotonic() < deadline, f"experiment {exp_id} did not end at its budget on CT {vmid}"
            time.sleep(0.5)
    shown = remote.cli("sweep", "show", launched["sweep"], "--json")
    assert shown.exit_code == 0, shown.output
    table = json.loads(shown.stdout)
    rates = [v["throughput"] for v in table["variants"]]
    assert all(r > 0 for r in rates) and rates == sorted(rates, reverse=True), table
    assert all(v["status"] == "finished" and 0 < v["efficiency"] <= 1 for v in table["variants"]), table
    assert table["variants"][0]["best"]
