"""`orch deploy --ct N` end to end: the real CLI, the Proxmox API stand-in, real LXC containers, real sshd.

CT 200 is reached over SSH straight into the container; CT 201 through the node with `pct exec`
(its sshd is killed to prove it). Every failure must leave a clear error, a non-zero exit, and no
experiment left `launching`.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import EXAMPLE, Project, tmux_socket

pytestmark = pytest.mark.testbed

ROOT = "/workspace/orch"
CKPT = "/workspace/checkpoints"


# tinylm's steps in a CT take a fraction of a second with these (the defaults make one batch of every sample)
SMALL_BATCHES = '[batching]\nstrategy = "megabatch"\ntoken_budget = 4096\nmax_seq_len = 512\nseed = 0\n'


class RemoteProject(Project):
    def __init__(self, path: Path, testbed) -> None:
        super().__init__(path, Path("/nonexistent"))
        self.testbed = testbed
        self.known_hosts = path / "known_hosts"
        self.trusted = path / "trusted_hosts"
        shutil.copy(testbed.known_hosts_path, self.known_hosts)

    def write(self, *, steps: int = 100000, sleep: float = 0.01, verify_ssl: str | None = None,
              token_id: str | None = None, extra: str = "", sources: str = '["train.py"]',
              connect_timeout: float = 5, entries: bool = True, name: str = "tinylm",
              checkpoints: str | None = CKPT) -> None:
        api, node = self.testbed.api, self.testbed.node
        targets = """
[targets.ct200]
kind = "proxmox"
ct = 200
access = "ssh"
user = "root"

[targets.ct201]
kind = "proxmox"
ct = 201
access = "pct"
""" if entries else ""
        self.path.joinpath("orch.toml").write_text(f"""\
default_target = "{'ct200' if entries else 'local'}"

[project]
name = "{name}"
sources = {sources}
command = "python3 train.py"
env = {{ OMP_NUM_THREADS = "1", TINYLM_STEPS = "{steps}", TINYLM_SLEEP = "{sleep}", TINYLM_CKPT_EVERY = "10", TINYLM_SAMPLES = "600" }}

[paths]
root = "{ROOT}"
{f'checkpoints = "{checkpoints}"' if checkpoints else ""}

[run]
stop_timeout = 5
term_timeout = 3

[proxmox]
host = "{api.host}"
port = {api.port}
token_id = "{token_id or api.token_id}"
verify_ssl = "{verify_ssl or api.cert_path}"
timeout = 5
start_timeout = 60
node_ssh = {{ user = "root", host = "{node.address}", port = {node.port} }}

{SMALL_BATCHES if "[batching]" not in extra else ""}
[ssh]
known_hosts = ["{self.known_hosts}"]
trust_file = "{self.trusted}"
identity_file = "{self.testbed.key_path}"
connect_timeout = {connect_timeout}
connect_retries = 1
command_timeout = 60
{targets}
{extra}""")

    def rows(self) -> list:
        if not (self.path / ".orch" / "experiments.db").exists():
            return []
        return self.registry().list()


@pytest.fixture
def remote(testbed, tmp_path, monkeypatch, ct_pair):
    monkeypatch.setenv("ORCH_PROXMOX_TOKEN", testbed.api.token_secret)
    path = tmp_path / "proj"
    path.mkdir()
    shutil.copy(EXAMPLE / "train.py", path / "train.py")
    proj = RemoteProject(path, testbed)
    proj.write()
    return proj


def wait_state(project, target_args: list[str], states: tuple[str, ...], timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        res = project.cli("status", *target_args, "--json")
        assert res.exit_code == 0, res.output
        data = json.loads(res.stdout)
        if data["state"] in states:
            return data
        assert time.monotonic() < deadline, data
        time.sleep(0.5)


def on_ct(testbed, vmid: int, *argv: str) -> str:
    return testbed.ct(vmid).attach(*argv).stdout.decode()


def test_deploy_by_ct_id_over_ssh_restart_logs_status_stop(remote, testbed):
    res = remote.cli("deploy", "--ct", "200", "-m", "remote", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    exp = out["experiment"]
    assert exp["status"] == "running" and exp["target"] == "ct200"
    info = exp["target_info"]
    assert info["node"] == testbed.node.name and info["ct"] == 200 and info["address"] == "10.77.0.200"
    assert {"cores", "memory", "mounts", "devices", "gpus"} <= set(info["ct_config"])
    shown = remote.cli("experiments", "show", "1").stdout
    assert "node         pve1" in shown and "address      10.77.0.200" in shown
    assert out["stats"]["connections"] == 1  # one SSH connection for the whole deploy
    # the run really is in the container, in tmux, and its record is there too
    alive = testbed.ct(200).attach("tmux", "-L", tmux_socket(ROOT), "has-session", "-t", "orch-tinylm", check=False)
    assert alive.returncode == 0  # the run is in the project's tmux session on orch's socket
    record = json.loads(on_ct(testbed, 200, "cat", f"{ROOT}/runs/{remote.run_key(1)}/experiment.json"))
    assert record["id"] == 1 and record["revision"] == exp["revision"]
    deadline = time.monotonic() + 30
    while "ckpt-" not in on_ct(testbed, 200, "ls", CKPT):
        assert time.monotonic() < deadline
        time.sleep(0.5)
    data = wait_state(remote, ["--ct", "200"], ("running",))
    assert data["experiment"] == 1
    logs = remote.cli("logs", "--ct", "200", "-n", "2")
    assert logs.exit_code == 0 and "step=" in logs.stdout
    # the run imported orch's batching library, shipped inside the agent; no fallback
    assert "not importable" not in on_ct(testbed, 200, "cat", f"{ROOT}/runs/{remote.run_key(1)}/train.log")
    res = remote.cli("restart", "--ct", "200", "--clean-checkpoints", "--yes", "--json")
    assert res.exit_code == 0, res.output
    exp2 = json.loads(res.stdout)["experiment"]
    assert exp2["parent"] == 1 and exp2["checkpoints_action"] == "moved"
    trashed = on_ct(testbed, 200, "ls", exp2["checkpoints_entry"])
    assert "ckpt-" in trashed
    stop = remote.cli("stop", "--ct", "200", "--json")
    assert stop.exit_code == 0, stop.output
    assert json.loads(stop.stdout)["stopped"][0]["id"] == 2
    assert [e.status for e in sorted(remote.rows(), key=lambda e: e.id)] == ["stopped", "stopped"]
    # the project's tmux session is gone, asked on orch's own socket for this root (exit 1: no such session)
    gone = testbed.ct(200).attach("tmux", "-L", tmux_socket(ROOT), "has-session", "-t", "orch-tinylm", check=False)
    assert gone.returncode == 1


def test_any_ct_id_works_without_a_target_entry(remote, testbed):
    remote.write(entries=False)
    res = remote.cli("deploy", "--ct", "200", "--json")
    assert res.exit_code == 0, res.output
    exp = json.loads(res.stdout)["experiment"]
    assert exp["target"] == "ct200" and exp["target_info"]["address"] == "10.77.0.200"
    assert remote.cli("stop", "--ct", "200").exit_code == 0


def test_pct_mode_works_without_sshd_in_the_container(remote, testbed):
    testbed.kill_sshd(201)
    res = remote.cli("deploy", "--ct", "201", "--json")
    assert res.exit_code == 0, res.output
    exp = json.loads(res.stdout)["experiment"]
    assert exp["target_info"]["access"] == "pct" and exp["status"] == "running"
    assert json.loads(on_ct(testbed, 201, "cat", f"{ROOT}/runs/{remote.run_key(1)}/experiment.json"))["id"] == 1
    data = wait_state(remote, ["--ct", "201"], ("running",))
    assert data["experiment"] == 1
    res = remote.cli("restart", "--ct", "201", "--clean-checkpoints", "--yes")
    assert res.exit_code == 0, res.output
    logs = remote.cli("logs", "--ct", "201", "-n", "1")
    assert logs.exit_code == 0
    assert remote.cli("stop", "--ct", "201").exit_code == 0
    assert remote.registry().get(2).status == "stopped"


def test_a_stopped_ct_is_started_only_when_asked(remote, testbed):
    testbed.stop(200)
    res = remote.cli("deploy", "--ct", "200")
    assert res.exit_code == 3 and "is stopped" in res.output and "orch deploy --start" in res.output
    assert remote.rows() == []
    res = remote.cli("deploy", "--ct", "200", "--start", "--json")
    assert res.exit_code == 0, res.output
    exp = json.loads(res.stdout)["experiment"]
    assert exp["target_info"]["started"] is True and exp["status"] == "running"


@pytest.mark.parametrize("case", ["unknown_ct", "bad_token", "blind_token", "tls", "node_offline"])
def test_proxmox_failures_are_clear_and_leave_no_launching_row(remote, testbed, monkeypatch, case):
    from tests.testbed.pve_standin import Token

    expect = {"unknown_ct": "CT 999 not found", "bad_token": "401", "blind_token": "not found",
              "tls": "certificate", "node_offline": "595"}[case]
    args = ["deploy", "--ct", "999" if case == "unknown_ct" else "200"]
    if case == "bad_token":
        monkeypatch.setenv("ORCH_PROXMOX_TOKEN", "wrong-secret")
    elif case == "blind_token":
        testbed.api.tokens["root@pam!blind"] = Token("blind-secret", privileges=frozenset())
        monkeypatch.setenv("ORCH_PROXMOX_TOKEN", "blind-secret")
        remote.write(token_id="root@pam!blind")
    elif case == "tls":
        remote.write(verify_ssl="true")
        text = remote.path.joinpath("orch.toml").read_text().replace('verify_ssl = "true"', "verify_ssl = true")
        remote.path.joinpath("orch.toml").write_text(text)
    elif case == "node_offline":
        testbed.api.faults.node_offline = True
    try:
        res = remote.cli(*args)
    finally:
        testbed.api.faults.node_offline = False
        testbed.api.tokens.pop("root@pam!blind", None)
    assert res.exit_code == (7 if case in ("unknown_ct", "blind_token") else 3), res.output  # README's table
    assert expect.lower() in res.output.lower() and "hint:" in res.output
    if case == "blind_token":
        assert "privilege" in res.output.lower()
    assert testbed.api.token_secret not in res.output
    assert all(e.status != "launching" for e in remote.rows())


def test_host_keys_are_checked_strictly(remote, testbed):
    remote.known_hosts.write_text("")  # nothing known
    res = remote.cli("deploy", "--ct", "200")
    assert res.exit_code == 3 and "--trust-new-host" in res.output and "SHA256:" in res.output
    assert remote.rows() == []
    res = remote.cli("deploy", "--ct", "200", "--trust-new-host")
    assert res.exit_code == 0, res.output
    assert "10.77.0.200" in remote.trusted.read_text()
    again = remote.cli("status", "--ct", "200")  # recorded: no flag needed any more
    assert again.exit_code == 0, again.output
    # a changed key is refused, even with --trust-new-host
    other = testbed.ct(201).host_key_line.split(" ", 1)[1]
    remote.trusted.write_text(f"10.77.0.200 {other}\n")
    res = remote.cli("deploy", "--ct", "200", "--trust-new-host")
    assert res.exit_code == 3 and "changed" in res.output.lower()
    assert remote.cli("stop", "--ct", "200", "--trust-new-host").exit_code == 3


def test_connection_cut_mid_push_leaves_no_half_revision(remote, testbed, ct200):
    data = remote.path / "data"
    data.mkdir()
    for i in range(50):
        (data / f"shard{i:02d}.bin").write_bytes(bytes([i]) * (1 << 20))
    proxy = testbed.proxy("10.77.0.200", 22)
    host_key = testbed.ct(200).host_key_line.split(" ", 1)[1]
    remote.known_hosts.write_text(f"[127.0.0.1]:{proxy.port} {host_key}\n")
    remote.write(sources='["train.py", "data"]',
                 extra=f'\n[targets.cut]\nkind = "proxmox"\nct = 200\naddress = "127.0.0.1"\nport = {proxy.port}\n')

    def cut() -> None:
        while proxy.bytes_up < 10 << 20:
            time.sleep(0.002)
        proxy.stall()
        proxy.kill()

    threading.Thread(target=cut, daemon=True).start()
    res = remote.cli("deploy", "--target", "cut")
    assert res.exit_code == 3, res.output
    assert "connection" in res.output.lower() and "what was sent is kept" in res.output
    assert remote.rows() == []  # the push precedes the experiment: nothing to record yet
    revisions = on_ct(testbed, 200, "sh", "-c", f"ls -a {ROOT}/revisions 2>/dev/null || true").split()
    assert not [r for r in revisions if r not in (".", "..")]
    assert "1" not in on_ct(testbed, 200, "sh", "-c", f"ls {ROOT}/runs 2>/dev/null || true").split()
    res = remote.cli("deploy", "--target", "cut", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    pushed = out["pushed"]
    assert 0 < pushed["missing"] < 51 and pushed["bytes"] < 51 << 20
    assert out["experiment"]["revision"] in on_ct(testbed, 200, "ls", f"{ROOT}/revisions").split()
    assert remote.cli("stop", "--target", "cut").exit_code == 0


SLOW_STOP = """\
import pathlib, signal, sys, time
def stopping(*_):  # a run that takes 4 s to stop after Ctrl-C (as one saving its last checkpoint does)
    pathlib.Path("/tmp/orch-test-stopping").touch()
    time.sleep(4)
    sys.exit(0)
signal.signal(signal.SIGINT, stopping)
time.sleep(600)
"""


def _cut_target(remote, testbed, proxy) -> None:  # noqa: F811
    """Target ``cut``: CT 200 over SSH through ``proxy``."""
    host_key = testbed.ct(200).host_key_line.split(" ", 1)[1]
    with remote.known_hosts.open("a") as fh:
        fh.write(f"[127.0.0.1]:{proxy.port} {host_key}\n")
    toml = remote.path / "orch.toml"
    text = re.sub(r"\n\[targets\.cut\]\n.*", "", toml.read_text(), flags=re.S)
    toml.write_text(text + f'\n[targets.cut]\nkind = "proxmox"\nct = 200\naddress = "127.0.0.1"\nport = {proxy.port}\n')


def test_a_link_lost_for_good_once_the_stop_was_sent_says_the_target_finishes_the_start(remote, testbed, ct200):
    """The link drops while the old run stops and cannot be opened again: orch says the target finishes the start
    by itself (or leaves the old run), and once the target answers, orch status shows the new run running."""
    import subprocess
    import sys

    (remote.path / "slow.py").write_text(SLOW_STOP)
    remote.write(sources='["slow.py"]')
    toml = remote.path / "orch.toml"
    toml.write_text(toml.read_text().replace('command = "python3 train.py"', 'command = "python3 slow.py"'))
    proxy = testbed.proxy("10.77.0.200", 22)
    _cut_target(remote, testbed, proxy)
    first = remote.run("deploy", "--target", "cut")
    assert first.returncode == 0, first.stderr
    on_ct(testbed, 200, "rm", "-f", "/tmp/orch-test-stopping")
    deploy = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "deploy", "--target", "cut"],
                              cwd=remote.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    begin = time.monotonic()
    while on_ct(testbed, 200, "sh", "-c", "test -e /tmp/orch-test-stopping && echo yes || true") != "yes\n":
        assert deploy.poll() is None and time.monotonic() - begin < 60, deploy.communicate()
        time.sleep(0.05)
    proxy.close()  # the old run is stopping: the link drops, and no new connection gets through
    _, err = deploy.communicate(timeout=90)
    print(err)
    assert deploy.returncode == 3, err
    assert ("could not be asked what was done" in err and "the stop of old run 1 and the start of new run 2 were "
            "sent: the target finishes the start by itself once the old run stopped, or leaves the old run running "
            "if its stop had not begun; orch status shows which once it answers") in err, err
    assert "what the target did is unknown" not in err, err
    _cut_target(remote, testbed, testbed.proxy("10.77.0.200", 22))  # the link is back
    deadline = time.monotonic() + 60
    while (data := wait_state(remote, ["--target", "cut"], ("running",)))["experiment"] != 2:  # old run 1 stopping
        assert time.monotonic() < deadline, data
        time.sleep(0.5)
    assert remote.registry().get(1).status == "stopped" and remote.registry().get(2).status == "running"
    assert remote.run("stop", "--target", "cut").returncode == 0


def test_a_frozen_container_times_out_instead_of_hanging(remote, testbed):
    remote.write(connect_timeout=2)
    testbed.freeze(200)
    t = time.monotonic()
    res = remote.cli("deploy", "--ct", "200")
    elapsed = time.monotonic() - t
    assert res.exit_code == 3, res.output
    assert "timed out" in res.output.lower() or "timeout" in res.output.lower()
    assert elapsed < 30
    assert remote.rows() == []


def test_two_deploys_racing_on_one_ct_serialize(remote):
    import subprocess
    import sys

    procs = [subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "deploy", "--ct", "200", "--json"],
                              cwd=remote.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=180) for p in procs]
    codes = [p.returncode for p in procs]
    assert sorted(codes) in ([0, 0], [0, 5]), outs
    statuses = sorted(e.status for e in remote.rows())
    assert "launching" not in statuses
    assert statuses.count("running") == 1
    assert remote.cli("stop", "--ct", "200").exit_code == 0
