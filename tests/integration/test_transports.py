"""SshTransport and PctTransport against real containers, a real node sshd and real faults."""

from __future__ import annotations

import os
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest

from orchestrator.errors import HostKeyError, TransportError, TransportTimeout
from orchestrator.reach.transport.pct import PctTransport
from orchestrator.reach.transport.hostkeys import fingerprint
from orchestrator.reach.transport.ssh import SshTransport

pytestmark = pytest.mark.testbed


def ssh_to(testbed, address: str, port: int = 22, *, known_hosts: str | None = None, **kw) -> SshTransport:
    """A transport with the session key and only the given known_hosts (never the user's own files)."""
    known = known_hosts or testbed.known_hosts_path
    kw.setdefault("trust_file", known)
    return SshTransport(address, port=port, user="root", identity_file=testbed.key_path,
                        known_hosts_files=[known], ssh_config_file=os.devnull, **kw)


def pct_to(testbed, vmid: int) -> PctTransport:
    node = testbed.node
    return PctTransport(ssh_to(testbed, node.address, node.port), vmid)


def host_key_blob(testbed, vmid: int) -> bytes:
    import base64

    return base64.b64decode(testbed.ct(vmid).host_key_line.split()[2])


# -- SshTransport -------------------------------------------------------------------------------------


def test_run_returns_exit_code_stdout_and_stderr(testbed, ct200):
    with ssh_to(testbed, ct200.address) as t:
        result = t.run(["sh", "-c", 'echo out; echo err >&2; exit 3'])
        assert (result.exit_code, result.stdout, result.stderr) == (3, b"out\n", b"err\n")
        assert t.run(["hostname"]).stdout == b"ct200\n"


def test_arguments_arrive_verbatim_without_a_shell(testbed, ct200):
    tricky = ["it's", "$HOME", "a b", "`id`", "; rm -rf /", "", "naïve\n"]
    with ssh_to(testbed, ct200.address) as t:
        result = t.run(["python3", "-c", "import sys, json; print(json.dumps(sys.argv[1:]))", *tricky])
    import json

    assert json.loads(result.stdout) == tricky


def test_binary_stdin_round_trip_of_several_megabytes(testbed, ct200):
    data = os.urandom(4 << 20) + bytes(range(256)) * 64
    with ssh_to(testbed, ct200.address) as t:
        result = t.run(["cat"], input=data)
        echoed = t.run(["sh", "-c", "cat; head -c 3000000 /dev/zero >&2"], input=data)
    assert result.ok and result.stdout == data
    assert echoed.stdout == data and echoed.stderr == bytes(3000000)


def test_one_connection_serves_many_runs_and_puts(testbed, ct200):
    with ssh_to(testbed, ct200.address) as t:
        for i in range(20):
            assert t.run(["true"]).ok
        for i in range(10):
            t.put(f"file {i}\n".encode(), f"/root/many/{i}.txt")
        assert t.run(["cat", "/root/many/9.txt"]).stdout == b"file 9\n"
        assert t.stats.connections == 1
        assert t.stats.commands == 21


def test_puts_from_many_threads_on_one_connection_all_land_whole(testbed, ct200):
    # the keeper serves each client's request in a thread of its own, on the one connection it holds: two deploys
    # racing on one CT push their agent through the same transport at the same time. Unserialized, paramiko's one
    # SFTP session mixed their requests and replies up (a put waiting out its timeout, or sftp-server hanging up)
    import hashlib

    def push(i: int, blob: bytes) -> None:
        try:
            start.wait()
            t.put(blob, f"/root/racing/{i}.bin", mode=0o600)
        except BaseException as exc:  # noqa: BLE001 - handed to the assertion below
            errors.append(exc)

    with ssh_to(testbed, ct200.address, connect_timeout=5) as t:
        for round in range(3):
            blobs = [os.urandom((1 << 20) + i * 4099 + round) for i in range(12)]
            errors: list[BaseException] = []
            start = threading.Barrier(len(blobs))
            threads = [threading.Thread(target=push, args=(i, blob)) for i, blob in enumerate(blobs)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(120)
            assert not errors, errors
            sums = t.run(["sh", "-c", "cd /root/racing && sha256sum *.bin"]).stdout.decode()
            landed = dict(reversed(line.split()) for line in sums.splitlines())
            assert landed == {f"{i}.bin": hashlib.sha256(b).hexdigest() for i, b in enumerate(blobs)}
        assert t.stats.connections == 1
        assert t.stats.bytes_sent == sum(3 * ((1 << 20) + i * 4099) + 3 for i in range(12))


def test_put_is_atomic_creates_parents_and_sets_mode(testbed, ct200):
    payload = os.urandom(300_000)
    with ssh_to(testbed, ct200.address) as t:
        t.put(payload, "/root/deep/er/blob.bin", mode=0o640)
        t.put(b"#!/bin/sh\necho hi\n", "/root/deep/run.sh", mode=0o755)
        t.put(b"second", "/root/deep/er/blob.bin", mode=0o600)
        assert t.run(["/root/deep/run.sh"]).stdout == b"hi\n"
        listing = t.run(["stat", "-c", "%a %s %n", "/root/deep/er/blob.bin", "/root/deep/run.sh"]).stdout.decode()
        leftovers = t.run(["find", "/root/deep", "-name", ".orch-put-*"]).stdout
    assert listing.splitlines() == ["600 6 /root/deep/er/blob.bin", "755 18 /root/deep/run.sh"]
    assert leftovers == b""


def test_put_into_an_unwritable_place_is_a_transport_error(testbed, ct200):
    with ssh_to(testbed, ct200.address) as t:
        with pytest.raises(TransportError, match="cannot write /proc/nope/x"):
            t.put(b"x", "/proc/nope/x")
        assert t.run(["true"]).ok


def test_unknown_host_key_is_refused_with_its_fingerprint(testbed, ct200, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    expected = fingerprint(host_key_blob(testbed, 200))
    with pytest.raises(HostKeyError) as info:
        ssh_to(testbed, ct200.address, known_hosts=str(empty)).run(["true"])
    assert expected in info.value.message and "--trust-new-host" in info.value.hint
    assert empty.read_text() == ""


def test_trust_new_host_records_the_key_once(testbed, ct200, tmp_path):
    trust = tmp_path / "orch" / "known_hosts"
    with ssh_to(testbed, ct200.address, known_hosts=str(trust), trust_new_host=True) as t:
        assert t.run(["true"]).ok
    assert trust.read_text().split() == testbed.ct(200).host_key_line.split()
    assert stat.S_IMODE(trust.stat().st_mode) == 0o600 and stat.S_IMODE(trust.parent.stat().st_mode) == 0o700
    with ssh_to(testbed, ct200.address, known_hosts=str(trust)) as t:
        assert t.run(["true"]).ok
    assert len(trust.read_text().splitlines()) == 1


def test_changed_host_key_is_refused_even_with_trust_new_host(testbed, ct200, tmp_path):
    other = testbed.ct(201).host_key_line.split()
    known = tmp_path / "known_hosts"
    known.write_text("# a comment\n" + " ".join([ct200.address, *other[1:]]) + "\n")
    for trust in (False, True):
        with pytest.raises(HostKeyError) as info:
            ssh_to(testbed, ct200.address, known_hosts=str(known), trust_new_host=trust).run(["true"])
        assert "CHANGED" in info.value.message and f"{known} line 2" in info.value.message
        hint = info.value.hint  # the likelier cause (an address now another machine's, a stale lookup) comes first
        assert hint.index("another machine's address") < hint.index("asks the API") < hint.index("ssh-keygen -R")
    assert len(known.read_text().splitlines()) == 2


def test_hashed_known_hosts_entries_are_honoured(testbed, ct200, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text(testbed.ct(200).host_key_line + "\n")
    subprocess.run(["ssh-keygen", "-H", "-f", str(known)], check=True, capture_output=True)
    assert ct200.address not in known.read_text()
    with ssh_to(testbed, ct200.address, known_hosts=str(known)) as t:
        assert t.run(["true"]).ok


def test_ssh_config_supplies_hostname_port_user_and_key(testbed, ct200, tmp_path):
    config = testbed.write_ssh_config(tmp_path / "config", {"trainbox": {
        "HostName": ct200.address, "Port": 22, "User": "root", "IdentityFile": testbed.key_path,
        "ConnectTimeout": 3}})
    t = SshTransport("trainbox", ssh_config_file=str(config), known_hosts_files=[testbed.known_hosts_path])
    with t:
        assert t.run(["hostname"]).stdout == b"ct200\n"
    assert t.description == f"root@{ct200.address}:22"


def test_wrong_key_is_an_auth_error_with_a_hint(testbed, ct200, tmp_path):
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    t = SshTransport(ct200.address, user="root", identity_file=str(stranger), ssh_config_file=os.devnull,
                     known_hosts_files=[testbed.known_hosts_path])
    with pytest.raises(TransportError) as info:
        t.run(["true"])
    assert "authorized_keys" in info.value.hint


def test_connection_refused_is_a_transport_error_after_retries(testbed, ct200):
    testbed.kill_sshd(200)
    t = ssh_to(testbed, ct200.address, connect_retries=2, backoff=0.1)
    begin = time.monotonic()
    with pytest.raises(TransportError, match="refused") as info:
        t.run(["true"])
    assert not isinstance(info.value, TransportTimeout)
    assert 0.3 <= time.monotonic() - begin < 3
    assert t.stats.connections == 0


def test_frozen_container_times_out_within_the_connect_timeout(testbed, ct200):
    testbed.freeze(200)
    begin = time.monotonic()
    with pytest.raises(TransportTimeout):
        ssh_to(testbed, ct200.address, connect_timeout=1.5).run(["true"])
    elapsed = time.monotonic() - begin
    print(f"frozen: timed out after {elapsed:.2f} s")
    assert elapsed < 1.5 + 1.0


def test_filtered_port_times_out_within_the_connect_timeout(testbed, ct200):
    from tests.testbed import faults

    faults.block(ct200.address, 22, "drop")
    begin = time.monotonic()
    with pytest.raises(TransportTimeout):
        ssh_to(testbed, ct200.address, connect_timeout=1.0).run(["true"])
    assert time.monotonic() - begin < 2.0


def test_command_timeout_raises_and_the_connection_stays_usable(testbed, ct200):
    with ssh_to(testbed, ct200.address) as t:
        begin = time.monotonic()
        with pytest.raises(TransportTimeout):
            t.run(["sleep", "30"], timeout=0.5)
        assert time.monotonic() - begin < 2
        assert t.run(["echo", "still"]).stdout == b"still\n"
        assert t.stats.connections == 1


def test_container_frozen_mid_command_is_detected_by_keepalives(testbed, ct200):
    with ssh_to(testbed, ct200.address, keepalive=1) as t:
        assert t.run(["true"]).ok
        threading.Timer(0.5, testbed.freeze, args=(200,)).start()
        begin = time.monotonic()
        with pytest.raises(TransportError, match="may or may not have run") as info:
            t.run(["sleep", "60"])
        elapsed = time.monotonic() - begin
    print(f"frozen mid-command: lost after {elapsed:.2f} s")
    assert not isinstance(info.value, TransportTimeout) and 4 <= elapsed < 8


def test_proxy_killed_mid_transfer_is_a_transport_error(testbed, ct200):
    proxy = testbed.proxy(ct200.address, 22)
    known = Path(testbed.known_hosts_path).parent / "known_hosts_proxy"
    known.write_text(f"[127.0.0.1]:{proxy.port} " + " ".join(testbed.ct(200).host_key_line.split()[1:]) + "\n")
    t = ssh_to(testbed, "127.0.0.1", proxy.port, known_hosts=str(known))
    assert t.run(["true"]).ok
    failure: list[BaseException] = []

    def transfer() -> None:
        try:
            t.run(["sh", "-c", "cat > /dev/null; sleep 5"], input=os.urandom(64 << 20))
        except BaseException as exc:
            failure.append(exc)

    worker = threading.Thread(target=transfer)
    worker.start()
    deadline = time.monotonic() + 10
    while proxy.bytes_up < (4 << 20) and time.monotonic() < deadline:
        time.sleep(0.01)
    proxy.kill()
    worker.join(10)
    assert not worker.is_alive()
    assert len(failure) == 1 and type(failure[0]) is TransportError
    assert "may or may not have run" in failure[0].message


def test_connection_lost_mid_put_is_a_transport_error(testbed, ct200):
    proxy = testbed.proxy(ct200.address, 22)
    known = Path(testbed.known_hosts_path).parent / "known_hosts_proxy_put"
    known.write_text(f"[127.0.0.1]:{proxy.port} " + " ".join(testbed.ct(200).host_key_line.split()[1:]) + "\n")
    t = ssh_to(testbed, "127.0.0.1", proxy.port, known_hosts=str(known))
    t.put(b"old", "/root/target.bin")
    failure: list[BaseException] = []

    def transfer() -> None:
        try:
            t.put(os.urandom(64 << 20), "/root/target.bin")
        except BaseException as exc:
            failure.append(exc)

    worker = threading.Thread(target=transfer)
    worker.start()
    while proxy.bytes_up < (4 << 20) and worker.is_alive():
        time.sleep(0.01)
    proxy.kill()
    worker.join(10)
    assert len(failure) == 1 and isinstance(failure[0], TransportError)
    assert testbed.ct(200).attach("cat", "/root/target.bin").stdout == b"old"


# -- PctTransport ------------------------------------------------------------------------------------


def test_pct_run_and_put_without_sshd_in_the_container(testbed, ct201):
    testbed.kill_sshd(201)
    data = os.urandom(2 << 20)
    with pct_to(testbed, 201) as t:
        result = t.run(["sh", "-c", "cat; echo oops >&2; exit 7"], input=data)
        assert (result.exit_code, result.stdout, result.stderr) == (7, data, b"oops\n")
        assert result.argv == ["sh", "-c", "cat; echo oops >&2; exit 7"]
        assert t.run(["hostname"]).stdout == b"ct201\n"
        assert t.run(["printf", "%s|", "it's", "$HOME", "a b"]).stdout == b"it's|$HOME|a b|"
        t.put(data, "/opt/new dir/it's.bin", mode=0o600)
        t.put(b"v2", "/opt/new dir/it's.bin", mode=0o640)
        check = t.run(["stat", "-c", "%a %s", "/opt/new dir/it's.bin"])
        leftovers = t.run(["sh", "-c", "ls -A '/opt/new dir'"]).stdout
        assert t.stats.connections == 1
    assert check.stdout == b"640 2\n" and leftovers == b"it's.bin\n"


def test_pct_on_a_stopped_container_is_a_transport_error(testbed, ct201):
    testbed.stop(201)
    with pct_to(testbed, 201) as t:
        with pytest.raises(TransportError, match="CT 201 .* not running") as info:
            t.run(["true"])
        assert "start" in info.value.hint
        with pytest.raises(TransportError, match="not running"):
            t.put(b"x", "/root/x")


def test_pct_on_a_missing_container_is_a_transport_error(testbed):
    with pct_to(testbed, 999) as t:
        with pytest.raises(TransportError, match="CT 999 does not exist") as info:
            t.run(["true"])
    assert "node" in info.value.hint


def test_pct_through_a_host_without_pct_is_a_transport_error(testbed, ct200):
    with PctTransport(ssh_to(testbed, ct200.address), 201) as t:
        with pytest.raises(TransportError, match="pct is not installed"):
            t.run(["true"])


def test_pct_command_exit_255_of_the_command_itself_is_a_result(testbed, ct201):
    with pct_to(testbed, 201) as t:
        result = t.run(["sh", "-c", "echo bye >&2; exit 255"])
    assert (result.exit_code, result.stderr) == (255, b"bye\n")


def test_node_pct_semantics(testbed, ct201):
    """The fake pct behaves as Proxmox's does for the calls orch and the tests rely on."""
    node = ssh_to(testbed, testbed.node.address, testbed.node.port)
    with node:
        assert node.run(["pct", "status", "201"]).stdout == b"status: running\n"
        unknown = node.run(["pct", "exec", "201", "ls", "-la"])
        assert unknown.exit_code == 255 and b"Unknown option" in unknown.stderr
        node.run(["sh", "-c", "printf hello > /tmp/orch-pct-src"])
        no_parent = node.run(["pct", "push", "201", "/tmp/orch-pct-src", "/nope/dir/file"])
        assert no_parent.exit_code == 255
        assert node.run(["pct", "push", "201", "/tmp/orch-pct-src", "/root/pushed"]).ok
        assert node.run(["pct", "exec", "201", "--", "stat", "-c", "%a", "/root/pushed"]).stdout == b"644\n"
        assert node.run(["pct", "pull", "201", "/root/pushed", "/tmp/orch-pct-dst"]).ok
        assert node.run(["cat", "/tmp/orch-pct-dst"]).stdout == b"hello"
        again = node.run(["pct", "start", "201"])
        assert again.exit_code == 255 and b"CT 201 already running" in again.stderr
        assert node.run(["pct", "stop", "201"]).ok
        assert node.run(["pct", "status", "201"]).stdout == b"status: stopped\n"
        pushed = node.run(["pct", "push", "201", "/tmp/orch-pct-src", "/root/x"])
        assert pushed.exit_code == 255 and b"can only push files to a running CT" in pushed.stderr
        assert node.run(["pct", "start", "201"]).ok
        node.run(["rm", "-f", "/tmp/orch-pct-src", "/tmp/orch-pct-dst"])


# -- the testbed's Proxmox API stand-in ---------------------------------------------------------------


def test_api_stand_in_reports_the_real_containers(testbed, ct201):
    import requests

    api = testbed.api
    def get(path: str) -> object:
        headers = {"Authorization": f"PVEAPIToken={api.token_id}={api.token_secret}"}
        response = requests.get(f"{api.base_url}{path}", headers=headers, verify=api.cert_path, timeout=5)
        return response.json()["data"]

    def status(vmid: int) -> str:
        return get(f"/nodes/{testbed.node.name}/lxc/{vmid}/status/current")["status"]

    resources = get("/cluster/resources?type=vm")
    assert {(r["vmid"], r["node"]) for r in resources if r["type"] == "lxc"} >= {(200, "pve1"), (201, "pve1")}
    assert status(201) == "running"
    testbed.stop(201)
    assert status(201) == "stopped"
