"""The connection keeper on a real CT over real sshd: started by the first command, one held connection (seen
from the CT) and a resident agent serving every later command, idle exit, a crashed keeper's socket, a cut
connection reopened once, a changed host key refused for a held connection, a new agent version."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from orchestrator.reach.keeper import client, place
from tests.conftest import wait_for
from tests.integration.test_remote import ROOT, on_ct, remote  # noqa: F401 (fixture)

pytestmark = pytest.mark.testbed


def held() -> list[dict]:
    """Every connection the keepers hold, with its keeper's pid."""
    return [dict(c, pid=k["pid"]) for k in client.keepers() for c in k["connections"]]


def ssh_peers(testbed, vmid: int = 200) -> list[int]:
    """The remote ports of the established TCP connections to the CT's sshd, read from /proc/net/tcp there."""
    peers = []
    for line in on_ct(testbed, vmid, "cat", "/proc/net/tcp", "/proc/net/tcp6").splitlines()[1:]:
        fields = line.split()
        if len(fields) > 3 and fields[1].endswith(":0016") and fields[3] == "01":
            peers.append(int(fields[2].rsplit(":", 1)[1], 16))
    return peers


def serving_agents(testbed, vmid: int = 200) -> list[str]:
    out = on_ct(testbed, vmid, "sh", "-c", "pgrep -af '[a]gent-.*[.]pyz serve' || true")
    return [line.split()[2].rsplit("/", 1)[-1] for line in out.splitlines() if line.strip()]


def ok(proj, *args: str, env: dict | None = None) -> str:
    res = proj.run(*args, env=env)
    assert res.returncode == 0, res.stderr
    return res.stdout


def warm(proj, target: str = "ct200", env: dict | None = None) -> dict:
    """The first command connects directly and starts a keeper; once it listens, a second opens its connection."""
    ok(proj, "status", "--target", target, env=env)
    wait_for(lambda: client.keepers(), timeout=30, what="a keeper listening")
    ok(proj, "status", "--target", target, env=env)
    [conn] = held()
    return conn


def test_later_commands_share_one_held_connection_and_a_resident_agent(remote, testbed):
    first = warm(remote)
    assert first["alive"] and first["connections"] == 1
    assert remote.cli("deploy", "--target", "ct200").exit_code == 0
    for _ in range(4):
        ok(remote, "status", "--target", "ct200")
    ok(remote, "logs", "--target", "ct200", "-n", "3")
    ok(remote, "checkpoints", "list", "--target", "ct200")
    [conn] = held()
    assert conn["pid"] == first["pid"] and conn["connections"] == 1 and conn["commands"] >= first["commands"] + 8
    assert ssh_peers(testbed) == [conn["local_port"]]  # the CT sees one SSH connection, the keeper's
    assert conn["agents"] == serving_agents(testbed) and len(conn["agents"]) == 1
    traced = subprocess.run([sys.executable, "-X", "importtime", "-m", "orchestrator.cli.main", "status", "--target",
                             "ct200"], cwd=remote.path, capture_output=True, text=True, timeout=60)
    assert traced.returncode == 0 and "orchestrator.reach.keeper.client" in traced.stderr, traced.stderr[-2000:]
    assert "paramiko" not in traced.stderr and "invoke" not in traced.stderr  # the keeper holds those
    listing = ok(remote, "connections", "list")
    assert "root@10.77.0.200:22" in listing and str(conn["pid"]) in listing

    assert "closed 1 connection(s)" in ok(remote, "connections", "close")
    assert client.keepers() == []
    wait_for(lambda: not ssh_peers(testbed) and not serving_agents(testbed), timeout=20,
             what="the connection and the resident agent gone from the CT")
    assert ok(remote, "stop", "--target", "ct200")


def test_an_idle_keeper_exits_and_a_crashed_ones_socket_is_replaced(remote, testbed):
    env = {"ORCH_SSH__PERSIST": "2"}
    conn = warm(remote, env=env)
    path = place.socket_path()
    assert path.exists()
    wait_for(lambda: not path.exists() and client.keepers() == [], timeout=30, what="the idle keeper gone")
    wait_for(lambda: not ssh_peers(testbed), timeout=20, what="its connection closed on the CT")

    conn = warm(remote)
    os.kill(conn["pid"], signal.SIGKILL)
    time.sleep(0.5)
    assert path.exists()  # left behind by the crash
    ok(remote, "status", "--target", "ct200")  # straight through, and a new keeper starts
    wait_for(lambda: client.keepers(), timeout=30, what="a new keeper")
    ok(remote, "status", "--target", "ct200")
    [again] = held()
    assert again["pid"] != conn["pid"] and again["connections"] == 1


def test_a_cut_connection_is_reopened_once_without_an_error(remote, testbed):
    proxy = testbed.proxy("10.77.0.200", 22)
    host_key = testbed.ct(200).host_key_line.split(" ", 1)[1]
    remote.known_hosts.write_text(remote.known_hosts.read_text() + f"[127.0.0.1]:{proxy.port} {host_key}\n")
    remote.write(extra=f'\n[targets.cut]\nkind = "proxmox"\nct = 200\naddress = "127.0.0.1"\nport = {proxy.port}\n')
    conn = warm(remote, "cut")
    proxy.kill()
    time.sleep(0.5)
    res = remote.run("status", "--target", "cut")
    assert res.returncode == 0, res.stderr
    assert "error" not in res.stderr
    [after] = held()
    assert after["pid"] == conn["pid"] and after["connections"] == 2 and after["alive"]


def test_a_changed_host_key_is_refused_even_for_a_held_connection(remote, testbed):
    warm(remote)
    good = remote.known_hosts.read_text()
    forged = testbed.ct(201).host_key_line.split(" ", 1)[1]
    lines = [f"{line.split(' ', 1)[0]} {forged}" if line.startswith("10.77.0.200 ") else line
             for line in good.splitlines()]
    assert lines != good.splitlines()
    remote.known_hosts.write_text("\n".join(lines) + "\n")
    res = remote.run("status", "--target", "ct200")
    assert res.returncode == 3, res.stderr
    assert "host key" in res.stderr and "changed" in res.stderr.lower()
    assert "Traceback" not in res.stderr
    remote.known_hosts.write_text(good)
    ok(remote, "status", "--target", "ct200")


def test_a_new_agent_version_gets_a_new_resident(remote, testbed):
    from orchestrator.reach.agent_client import AgentClient
    from orchestrator.config import load_settings
    from orchestrator.reach.targets import resolve_target

    warm(remote)
    [before] = serving_agents(testbed)
    settings = load_settings(remote.path / "orch.toml")
    transport = resolve_target(settings, "ct200").connect()
    agent = AgentClient(transport, ROOT)
    newer = agent.agent_path.replace(".pyz", "0.pyz")
    on_ct(testbed, 200, "cp", agent.agent_path, newer)
    agent.agent_path = newer
    assert agent.one("hello")["agent"] == newer
    wait_for(lambda: serving_agents(testbed) == [newer.rsplit("/", 1)[-1]], timeout=20,
             what="the old version's resident gone, the new one serving")
    assert before != newer.rsplit("/", 1)[-1]
    [conn] = held()
    assert conn["agents"] == [newer.rsplit("/", 1)[-1]] and conn["connections"] == 1


def test_a_resident_whose_workspace_was_replaced_is_replaced_not_reported(remote, testbed):
    """The CT's /workspace replaced under a live keeper (a restored or re-created volume): the resident agent's
    files are gone. The next commands work as on a fresh CT: the request runs one-shot (pushing the agent again)
    and a new resident serves the ones after it, with no "report it" and no failed row."""
    warm(remote)
    [before] = serving_agents(testbed)
    on_ct(testbed, 200, "sh", "-c", f"rm -rf {ROOT} && mkdir -p {ROOT}")
    res = remote.run("deploy", "--target", "ct200", "-m", "after the workspace was replaced")
    assert res.returncode == 0, res.stderr
    assert "report it" not in res.stderr and "ModuleNotFoundError" not in res.stderr
    out = ok(remote, "status", "--target", "ct200")
    assert "running" in out or "finished" in out, out
    with remote.registry() as reg:
        assert [e.status for e in reg.list()] != [] and all(e.status != "failed" for e in reg.list())
    wait_for(lambda: len(serving_agents(testbed)) == 1, timeout=20, what="one resident serving again")
    [conn] = held()
    assert conn["connections"] == 1 and conn["agents"] == serving_agents(testbed)
    assert before == serving_agents(testbed)[0]  # the same agent version, in a new process
    ok(remote, "stop", "--target", "ct200")


def test_a_push_through_the_keeper_outlives_a_shut_window(remote, testbed):
    """A slow link (tbf on the CT's veth) and the CT frozen for 1.5 s mid-push (a suspend-mode backup does
    that): sshd adjusts no window meanwhile, for longer than the held channel's read timeout. The push must
    go on once it thaws, as over a direct connection, not stall until [ssh] command_timeout."""
    warm(remote)
    (remote.path / "data").mkdir()
    (remote.path / "data" / "shard.bin").write_bytes(os.urandom(24 << 20))
    remote.write(sources='["train.py", "data"]')
    shape = ["tc", "qdisc", "add", "dev", "veth200i0", "root", "tbf", "rate", "100mbit", "burst", "64kb",
             "latency", "20ms"]
    subprocess.run(shape, check=True, capture_output=True)
    try:
        deploy = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "deploy", "--target", "ct200"],
                                  cwd=remote.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=dict(os.environ, ORCH_SSH__COMMAND_TIMEOUT="20"))
        time.sleep(1.0)  # probed; the push under way
        testbed.freeze(200)
        time.sleep(1.5)
        testbed.thaw(200)
        out, err = deploy.communicate(timeout=150)
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", "veth200i0", "root"], capture_output=True)
    assert deploy.returncode == 0, err
    [conn] = held()
    assert conn["connections"] == 1 and conn["commands"] >= 3  # the push went through the held connection
    ok(remote, "stop", "--target", "ct200")


def test_follow_through_the_keeper_survives_cuts_byte_for_byte(remote, testbed):
    from tests.integration.test_follow_remote import WRITER

    proxy = testbed.proxy("10.77.0.200", 22)
    host_key = testbed.ct(200).host_key_line.split(" ", 1)[1]
    remote.known_hosts.write_text(remote.known_hosts.read_text() + f"[127.0.0.1]:{proxy.port} {host_key}\n")
    remote.write(extra=f'\n[targets.cut]\nkind = "proxmox"\nct = 200\naddress = "127.0.0.1"\nport = {proxy.port}\n')
    remote.path.joinpath("train.py").write_text(WRITER)
    warm(remote, "cut")
    ok(remote, "deploy", "--target", "cut")
    follower = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "logs", "--target", "cut", "-f",
                                 "-n", "100000"], cwd=remote.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: follower.stdout.read(65536), b"")))
    reader.start()
    # the cuts come once the follower streams (its start-up, slow on a loaded machine, must not outlast them)
    deadline = time.monotonic() + 60
    while not chunks and follower.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    for _ in range(2):
        time.sleep(0.5)
        proxy.kill()
    follower.wait(timeout=180)
    err = follower.stderr.read()
    reader.join(timeout=30)
    assert follower.returncode == 0, err.decode()
    on_target = testbed.ct(200).attach("cat", f"{ROOT}/runs/{remote.run_key(1)}/train.log").stdout
    assert len(on_target) > 500_000 and b"".join(chunks) == on_target
    assert b"resuming at byte" in err
    [conn] = held()
    assert conn["connections"] >= 2  # the keeper reopened its connection after the cuts


def test_a_pct_target_gets_a_resident_agent_through_the_held_node_connection(remote, testbed):
    conn = warm(remote, "ct201")
    assert conn["role"].startswith("the Proxmox node") and conn["connections"] == 1
    ok(remote, "status", "--target", "ct201")
    [again] = held()
    assert again["agents"] == serving_agents(testbed, 201) and len(again["agents"]) == 1  # inside the CT
    assert again["connections"] == 1 and again["commands"] > conn["commands"]
    testbed.stop(201)
    try:
        res = remote.run("status", "--target", "ct201")  # the resident went with the CT: one clear error
        assert res.returncode != 0 and "201" in res.stderr and "Traceback" not in res.stderr, res.stderr
    finally:
        testbed.start(201)
    ok(remote, "status", "--target", "ct201")
    assert len(serving_agents(testbed, 201)) == 1  # a new resident in the restarted CT


def test_a_run_started_through_a_held_resident_gets_the_login_environment_as_it_is_now(remote, testbed):
    """A variable added to the login's startup file (root's ``~/.bashrc``, which bash reads for a command sshd
    runs) while the keeper holds its connection and resident agent: the next deploy's run has it, as a fresh login
    would (the resident, started before the change, is replaced on the same connection)."""
    import json

    def run_environ() -> dict:
        with remote.registry() as reg:
            exp_id = max(e.id for e in reg.list())
        key = remote.run_key(exp_id)
        pid = wait_for(lambda: json.loads(on_ct(testbed, 200, "sh", "-c", f"cat {ROOT}/runs/{key}/pid.json "
                                                "2>/dev/null || echo null")), timeout=30, what="the run's pid")
        raw = testbed.ct(200).attach("cat", f"/proc/{pid['child']}/environ").stdout
        return dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)

    before = on_ct(testbed, 200, "cat", "/root/.bashrc")
    try:
        warm(remote)
        ok(remote, "deploy", "--target", "ct200")
        assert b"ORCH_FRESH_LOGIN" not in run_environ()
        testbed.ct(200).attach("sh", "-c", "echo export ORCH_FRESH_LOGIN=yes >> /root/.bashrc")
        ok(remote, "deploy", "--target", "ct200")
        assert run_environ().get(b"ORCH_FRESH_LOGIN") == b"yes"
        [conn] = held()
        assert conn["connections"] == 1  # the same held connection: only its resident agent was replaced
        ok(remote, "stop", "--target", "ct200")
    finally:
        testbed.ct(200).attach("sh", "-c", 'printf %s "$1" > /root/.bashrc', "sh", before)
