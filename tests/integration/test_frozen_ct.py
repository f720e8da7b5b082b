"""Frozen and hard-stopped containers (real LXC, real sshd, the node's pct, the real CLI in a subprocess):
read-only commands fail fast, a stopped CT's run says why it ended, and a stop's grace period does not
run while the CT is frozen."""

from __future__ import annotations

import json
import time

import pytest

from tests.integration.test_remote import ROOT, on_ct, remote, wait_state  # noqa: F401 (fixture)

pytestmark = pytest.mark.testbed

READ = {"ORCH_SSH__READ_TIMEOUT": "4"}


@pytest.mark.parametrize("ct", [200, 201], ids=["ssh", "pct"])
def test_read_only_commands_on_a_frozen_ct_fail_within_the_read_timeout(remote, testbed, ct):
    res = remote.run("deploy", "--ct", str(ct))
    assert res.returncode == 0, res.stderr
    wait_state(remote, ["--ct", str(ct)], ("running",))
    testbed.freeze(ct)
    try:
        for argv in (["status"], ["logs", "-n", "5"], ["checkpoints", "list"]):
            begin = time.monotonic()
            res = remote.run(*argv, "--ct", str(ct), env=READ, timeout=120)
            took = time.monotonic() - begin
            assert res.returncode == 3, (argv, res.stdout, res.stderr)
            assert took < 25, (argv, took)  # the command timeout (60 s here, 300 s by default) never applies
            assert "error:" in res.stderr and "Traceback" not in res.stderr
            if ct == 201:  # through the node: the node answers, the CT does not
                assert "[ssh] read_timeout" in res.stderr, res.stderr
    finally:
        testbed.thaw(ct)
    assert remote.run("status", "--ct", str(ct), env=READ).returncode == 0


# prints a step every 0.1 s; on SIGINT it takes 1.5 s of work to write its final checkpoint, then exits 0
GRACEFUL = """\
import os, pathlib, signal, sys, time
ck = pathlib.Path(os.environ["ORCH_CHECKPOINT_DIR"])
def final(*_):
    print("got SIGINT", flush=True)
    end = time.monotonic() + 1.5
    while time.monotonic() < end:
        pass
    (ck / "final.pt").write_text("done")
    print("final checkpoint written", flush=True)
    sys.exit(0)
signal.signal(signal.SIGINT, final)
step = 0
while True:
    print(f"step={step} loss=1.0", flush=True)
    step += 1
    time.sleep(0.1)
"""


def _deploy_script(remote, ct: int, script: str, *sets: str) -> None:
    (remote.path / "job.py").write_text(script)
    args = ["--set", "project.sources=['job.py']", "--set", "project.command=python3 job.py"]
    for s in sets:
        args += ["--set", s]
    res = remote.run("deploy", "--ct", str(ct), *args)
    assert res.returncode == 0, res.stderr
    wait_state(remote, ["--ct", str(ct)], ("running",))


def test_a_hard_stopped_ct_says_the_container_stopped_and_the_end_time_is_unknown(remote, testbed):
    _deploy_script(remote, 200, GRACEFUL)
    testbed.stop(200)  # lxc-stop -k: every process gone at once, nothing recorded
    testbed.start(200)
    before = time.time()
    res = remote.run("status", "--ct", "200")
    assert res.returncode == 0, res.stderr
    assert "experiment 1 lost (the container stopped; end time unknown, noticed at" in res.stdout, res.stdout
    exp = remote.registry().get(1)
    assert exp.status == "lost" and exp.ended is None and exp.exit_code is None
    assert exp.end_reason.startswith("the container stopped; end time unknown, noticed at ")
    assert time.strftime("%Y-%m-%d", time.localtime(before)) in exp.end_reason


def test_a_ct_frozen_during_a_graceful_stop_still_gets_its_whole_grace_period(remote, testbed):
    import subprocess
    import sys

    _deploy_script(remote, 200, GRACEFUL)
    ct = testbed.ct(200)
    log = ct.delta / ROOT.lstrip("/") / "runs" / remote.run_key(1) / "train.log"  # read from the host: no attach
    env = dict(__import__("os").environ, ORCH_RUN__STOP_TIMEOUT="3")
    stop = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "stop", "--ct", "200"],
                            cwd=remote.path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while "got SIGINT" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, "the SIGINT never arrived"
        time.sleep(0.02)
    testbed.freeze(200)  # longer than stop_timeout, while the run writes its final checkpoint
    time.sleep(6)
    testbed.thaw(200)
    out, err = stop.communicate(timeout=90)
    assert stop.returncode == 0, err
    assert "signals: SIGINT)" in out, out + err
    assert on_ct(testbed, 200, "cat", "/workspace/checkpoints/final.pt") == "done"
    assert "final checkpoint written" in log.read_text()
    assert json.loads(remote.run("experiments", "show", "1", "--json").stdout)["status"] == "stopped"
