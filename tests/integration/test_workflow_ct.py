"""The README's headline sequence on a real container, typed as a user types it.

`orch deploy --ct 200`, then bare `status`, `restart --clean-checkpoints` (the prompt answered on a
pseudo-terminal), `logs --follow` (ended by a `stop` from another terminal). Also: one CT under two
target names is one machine, and two projects on one CT keep their checkpoints apart by default.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import STUBBORN, run_on_pty
from tests.integration.test_remote import ROOT, on_ct, remote  # noqa: F401  (the fixture)

pytestmark = pytest.mark.testbed

PCT_ENTRY = """
[targets.ct200-pct]
kind = "proxmox"
ct = 200
access = "pct"
"""


def orch(project, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return project.run(*args, timeout=timeout)


def test_the_headline_sequence_as_typed(remote, testbed):
    remote.write(entries=False, checkpoints=None)  # default_target = "local"; CT 200 has no entry
    env = {"ORCH_PROXMOX_TOKEN": testbed.api.token_secret}
    res = remote.run("deploy", "--ct", "200", "-m", "first", env=env)
    assert res.returncode == 0, res.stderr
    node = testbed.node.name
    assert f"experiment 1: started on CT 200 on {node}" in res.stdout
    status = remote.run("status", env=env)
    assert status.returncode == 0, status.stderr
    assert status.stdout.startswith(f"CT 200 on {node}: experiment 1 running")
    ckpt = "/workspace/checkpoints/tinylm"  # the default folder is the project's own
    deadline = time.monotonic() + 30
    while "ckpt-" not in on_ct(testbed, 200, "ls", ckpt):
        assert time.monotonic() < deadline, "no checkpoint written"
        time.sleep(0.5)
    argv = [sys.executable, "-m", "orchestrator.cli.main", "restart", "--clean-checkpoints"]
    code, screen = run_on_pty(argv, remote.path, {"move to the trash": "y"}, env=env)
    assert code == 0, screen
    assert f"on CT 200 on {node}?" in screen  # the question names the machine
    assert f"experiment 2: started on CT 200 on {node}" in screen
    exp2 = remote.registry().get(2)
    assert exp2.parent == 1 and exp2.checkpoints_action == "moved" and exp2.checkpoints_entry.endswith("-exp1")
    assert "ckpt-" in on_ct(testbed, 200, "ls", exp2.checkpoints_entry)
    follow = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "logs", "--follow", "-n", "1"],
                              cwd=remote.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, **env})
    time.sleep(3)
    stop = remote.run("stop", env=env)
    assert stop.returncode == 0 and f"experiment 2 on CT 200 on {node}: stopped" in stop.stdout
    out, err = follow.communicate(timeout=60)
    assert follow.returncode == 0, err
    assert "step=" in out and "experiment 2 stopped" in err
    assert [e.status for e in sorted(remote.rows(), key=lambda e: e.id)] == ["stopped", "stopped"]
    assert json.loads((remote.path / ".orch" / "current-target.json").read_text()) == {"ct": 200}


def test_one_ct_under_two_target_names_is_one_machine(remote, testbed):
    remote.write(extra=PCT_ENTRY)
    res = remote.cli("deploy", "--target", "ct200", "--json")
    assert res.exit_code == 0, res.output
    via_pct = remote.cli("status", "--target", "ct200-pct", "--json")
    assert via_pct.exit_code == 0, via_pct.output
    data = json.loads(via_pct.stdout)
    assert data["experiment"] == 1 and data["state"] == "running"
    # --ct 200 matches both entries: it says so and which one it uses (the current one)
    res = remote.cli("status", "--ct", "200")
    assert "CT 200 matches targets ct200 (ssh), ct200-pct (pct); using ct200" in res.output
    # a restart through the other way in continues the same run history
    res = remote.cli("restart", "--target", "ct200-pct", "--json")
    assert res.exit_code == 0, res.output
    exp2 = json.loads(res.stdout)["experiment"]
    assert exp2["parent"] == 1 and remote.registry().get(1).status == "stopped"
    assert remote.cli("stop").exit_code == 0  # bare: the current target is now ct200-pct
    assert remote.registry().get(2).status == "stopped"


def test_a_second_project_on_the_ct_never_sees_the_first_ones_checkpoints(remote, testbed, tmp_path):
    import shutil

    remote.write(checkpoints=None)
    res = remote.cli("deploy", "--ct", "200")
    assert res.exit_code == 0, res.output
    deadline = time.monotonic() + 30
    while "ckpt-" not in on_ct(testbed, 200, "ls", "/workspace/checkpoints/tinylm"):
        assert time.monotonic() < deadline
        time.sleep(0.5)
    (tmp_path / "other").mkdir()
    other = type(remote)(tmp_path / "other", testbed)
    shutil.copy(remote.path / "train.py", other.path / "train.py")
    other.write(name="second", checkpoints=None)
    res = other.cli("deploy", "--ct", "200", "--json")
    assert res.exit_code == 0, res.output
    exp = json.loads(res.stdout)["experiment"]
    assert exp["checkpoints"] == "/workspace/checkpoints/second"
    assert "holds" not in res.output
    deadline = time.monotonic() + 30
    while " loss=" not in (log := on_ct(testbed, 200, "cat", f"{ROOT}/runs/{other.run_key(exp['id'])}/train.log")):
        assert time.monotonic() < deadline, log
        time.sleep(0.5)
    assert "resumed from" not in log
    assert other.cli("stop").exit_code == 0 and remote.cli("stop").exit_code == 0


def test_ctrl_c_during_a_deploy_over_ssh_says_what_was_done(remote, testbed):
    import signal

    (remote.path / "stubborn.py").write_text(STUBBORN)
    remote.write(sources='["stubborn.py"]', extra='')
    text = remote.path.joinpath("orch.toml").read_text().replace('command = "python3 train.py"',
                                                                  'command = "python3 stubborn.py"')
    remote.path.joinpath("orch.toml").write_text(text)
    assert remote.run("deploy", "--ct", "200").returncode == 0
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "deploy"], cwd=remote.path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while on_ct(testbed, 200, "ls", f"{ROOT}/runs/{remote.run_key(1)}").count("stop_requested") == 0:
        assert time.monotonic() < deadline, "the old run was never asked to stop"
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 130, err
    # the stop in progress finishes, and so does the start after it: one run of the project runs
    assert "interrupted: new run 2 started (running); old run 1 stopped; to go back: orch restart -e 1" in err, err
    reg = remote.registry()
    assert reg.get(1).status == "stopped" and reg.get(2).status == "running"
    assert remote.run_key(2) in on_ct(testbed, 200, "ls", f"{ROOT}/runs").split()
    assert remote.run("stop", "--ct", "200").returncode == 0


def test_a_link_dropped_during_a_deploy_says_so_and_the_target_starts_the_new_run(remote, testbed):
    """The connection is cut while the old run stops, with no Ctrl-C: orch says the connection dropped (not
    "interrupted"), asks again, and hears that the target went on to the new run's start."""
    proxy = testbed.proxy(testbed.ct(200).address, 22)
    host_key = testbed.ct(200).host_key_line.split(" ", 1)[1]
    (remote.path / "stubborn.py").write_text(STUBBORN)
    remote.write(sources='["stubborn.py"]',
                 extra=f'\n[targets.cut]\nkind = "proxmox"\nct = 200\naddress = "127.0.0.1"\nport = {proxy.port}\n')
    text = remote.path.joinpath("orch.toml").read_text().replace('command = "python3 train.py"',
                                                                  'command = "python3 stubborn.py"')
    remote.path.joinpath("orch.toml").write_text(text)
    remote.known_hosts.write_text(remote.known_hosts.read_text() + f"[127.0.0.1]:{proxy.port} {host_key}\n")
    assert remote.run("deploy", "--target", "cut").returncode == 0
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "deploy", "--target", "cut"],
                            cwd=remote.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while on_ct(testbed, 200, "ls", f"{ROOT}/runs/{remote.run_key(1)}").count("stop_requested") == 0:
        assert time.monotonic() < deadline, "the old run was never asked to stop"
        time.sleep(0.1)
    proxy.kill()
    out, err = proc.communicate(timeout=90)
    assert proc.returncode != 0, err
    assert "orch: the connection dropped; asking " in err and "what was done (Ctrl-C to leave now)" in err, err
    assert "interrupted" not in err, err
    assert "; new run 2 started (running); old run 1 stopped; to go back: orch restart -e 1" in err, err
    reg = remote.registry()
    assert reg.get(1).status == "stopped" and reg.get(2).status == "running"
    assert remote.run("stop", "--target", "cut").returncode == 0
