"""A CT is who the Proxmox API says it is, on every connection: a clone of CT 200 (its disk: orch's root, its
machine id, its SSH host keys) answering at the address orch remembered for CT 200 is never taken for it.

CT 201 is made into such a clone; its hostname and MAC address stay its own, as Proxmox gives a clone. The
remembered lookup of CT 200 is pointed at CT 201's address, as when a stopped CT's DHCP address is handed on.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.conftest import tmux_socket
from tests.integration.test_remote import ROOT, remote  # noqa: F401  (the fixture)

pytestmark = pytest.mark.testbed


def _cache(remote) -> dict:  # noqa: F811
    return json.loads((remote.path / ".orch" / "ct-cache.json").read_text())


def _remembered_at(remote, testbed, entry: dict, address: str) -> None:  # noqa: F811
    """The lookup of CT 200 as orch remembered it, with ``address`` as its address (and fresh)."""
    key = f"{testbed.api.host}:{testbed.api.port}/200/ssh"
    data = {key: {**entry, "address": address, "at": time.time()}}
    (remote.path / ".orch" / "ct-cache.json").write_text(json.dumps(data))


def _clone(testbed, src: int, dst: int, known_hosts) -> None:
    """CT ``dst`` gets what a clone of CT ``src`` copies: orch's folders, /etc/machine-id and the SSH host keys;
    known_hosts lists ``src``'s key for ``dst``'s address (the address's key orch trusted before)."""
    s, d = testbed.ct(src), testbed.ct(dst)
    keys = ["etc/ssh/ssh_host_ed25519_key", "etc/ssh/ssh_host_ed25519_key.pub"]
    copied = s.attach("tar", "-C", "/", "--warning=no-file-changed", "-cf", "-", "workspace", *keys, check=False)
    assert copied.returncode in (0, 1), copied.stderr  # 1: a file the live run writes changed as it was read
    files = copied.stdout
    d.attach("rm", "-rf", "/workspace")
    d.attach("tar", "-C", "/", "-xf", "-", input=files)
    d.attach("sh", "-c", 'cat > /etc/machine-id', input=s.attach("cat", "/etc/machine-id").stdout)
    d.attach("sh", "-c", 'kill -HUP "$(cat /run/sshd.pid)"')  # sshd reads its host keys again
    blob = s.host_key_line.split(" ", 1)[1]
    deadline = time.monotonic() + 10
    while blob.split()[1] not in subprocess.run(["ssh-keyscan", "-t", "ed25519", d.address], capture_output=True,
                                                text=True).stdout:
        assert time.monotonic() < deadline, "CT 201's sshd did not take CT 200's host key"
        time.sleep(0.2)
    lines = [ln for ln in known_hosts.read_text().splitlines() if not ln.startswith(d.address + " ")]
    known_hosts.write_text("\n".join([*lines, f"{d.address} {blob}"]) + "\n")


def _runs(ct) -> list[str]:
    return sorted(ct.attach("sh", "-c", "ls /workspace/orch/runs 2>/dev/null || true").stdout.decode().split())


def _key(remote, exp_id: int) -> str:  # noqa: F811
    with remote.registry() as reg:
        return f"{reg.registry_id}-{exp_id}"


def _row(remote, exp_id: int):  # noqa: F811
    with remote.registry() as reg:
        return reg.get(exp_id)


def test_the_cached_path_reaches_the_ct_without_the_api_and_knows_it_by_its_mark(remote, testbed):  # noqa: F811
    assert remote.run("deploy", "--ct", "200").returncode == 0
    ct = testbed.ct(200)
    mark = json.loads(ct.attach("cat", f"{ROOT}/identity.json").stdout)
    machine_id = ct.attach("cat", "/etc/machine-id").stdout.decode().strip()
    assert mark["vmid"] == 200 and mark["machine_id"] == machine_id  # written on first contact
    entry = next(iter(_cache(remote).values()))
    assert entry["machine_id"] == machine_id and entry["hwaddrs"] == ["bc:24:11:00:00:c8"]
    asked = len(testbed.api.requests)
    for argv in (("status",), ("logs", "-n", "1")):
        res = remote.run(*argv)
        assert res.returncode == 0, (argv, res.stderr)
    assert len(testbed.api.requests) == asked  # checked in the agent's answers: no API call, no extra round trip


def test_a_clone_at_a_stopped_cts_address_is_refused_and_stop_settles_the_row(remote, testbed):  # noqa: F811
    assert remote.run("deploy", "--ct", "200").returncode == 0
    entry = next(iter(_cache(remote).values()))
    _clone(testbed, 200, 201, remote.known_hosts)
    testbed.ct(200).stop()
    clone = testbed.ct(201)
    there = _runs(clone)
    assert there  # the clone holds a copy of experiment 1's run folder

    _remembered_at(remote, testbed, entry, clone.address)
    res = remote.run("deploy", "--ct", "200")
    assert res.returncode == 3, res.stdout + res.stderr
    assert "CT 200 is stopped" in res.stderr and "its hostname is ct201" in res.stderr, res.stderr
    assert _runs(clone) == there and [r.id for r in remote.rows()] == [1]  # nothing started, nothing recorded

    _remembered_at(remote, testbed, entry, clone.address)
    res = remote.run("status", "--ct", "200")
    assert res.returncode == 3 and "ct201" in res.stderr, res.stdout + res.stderr
    assert _row(remote, 1).status == "running"  # not the clone's copy of the run read as CT 200's

    _remembered_at(remote, testbed, entry, clone.address)
    res = remote.run("exec", "--ct", "200", "--", "hostname")
    assert res.returncode == 3 and "ct201" not in res.stdout, res.stdout + res.stderr  # no command ran there

    _remembered_at(remote, testbed, entry, clone.address)
    res = remote.run("stop", "-e", "1")
    assert res.returncode == 0, res.stdout + res.stderr
    row = _row(remote, 1)
    assert row.status == "lost" and "CT 200 is stopped" in row.end_reason, (row.status, row.end_reason)
    assert "recorded as lost" in res.stdout
    key = _key(remote, 1)
    assert clone.attach("test", "-e", f"{ROOT}/runs/{key}/stop_requested", check=False).returncode != 0


def test_a_clone_at_the_remembered_address_sends_orch_to_the_cts_address_now(remote, testbed):  # noqa: F811
    assert remote.run("deploy", "--ct", "200").returncode == 0
    entry = next(iter(_cache(remote).values()))
    _clone(testbed, 200, 201, remote.known_hosts)
    clone = testbed.ct(201)
    there = _runs(clone)

    _remembered_at(remote, testbed, entry, clone.address)
    res = remote.run("status", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["state"] == "running"  # CT 200's run, not the clone's copy (which reads lost)
    assert next(iter(_cache(remote).values()))["address"] == testbed.ct(200).address  # asked again, remembered

    _remembered_at(remote, testbed, entry, clone.address)
    res = remote.run("deploy")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "experiment 2: started on CT 200" in res.stdout + res.stderr
    key = _key(remote, 2)
    assert key in _runs(testbed.ct(200)) and _runs(clone) == there  # on CT 200; the clone untouched


def test_stop_of_a_run_the_ct_does_not_know_settles_its_row(remote, testbed):  # noqa: F811
    assert remote.run("deploy", "--ct", "200").returncode == 0
    ct = testbed.ct(200)
    ct.attach("tmux", "-L", tmux_socket(ROOT), "kill-server")
    deadline = time.monotonic() + 10  # as when experiment 1 was started on another machine
    while ct.attach("rm", "-rf", f"{ROOT}/runs", check=False).returncode != 0:  # its supervisor's last writes
        assert time.monotonic() < deadline
        time.sleep(0.2)
    res = remote.run("stop", "-e", "1")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "has no run of experiment 1" in res.stdout and "recorded as lost" in res.stdout, res.stdout
    row = _row(remote, 1)
    assert row.status == "lost" and "has no run of experiment 1" in row.end_reason
