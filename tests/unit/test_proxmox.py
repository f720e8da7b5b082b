"""The Proxmox resolver against the HTTPS stand-in, through real proxmoxer and requests."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator

import pytest

from orchestrator.errors import ConfigError, CtNotRunning, InputError, NotFoundError, OrchError, ProxmoxError, TargetError
from orchestrator.reach.proxmox import ProxmoxApiError, ProxmoxClient, config_summary, load_token, pick_address, resolve_ct, static_address
from tests.testbed.pve_backends import MemoryBackend, MemoryCt
from tests.testbed.pve_standin import StandIn, Token, start_standin

SECRET = "0f3c9e2a-7b41-4d8e-a5c6-19d2e8b7f4a3"
FAST = {"poll_interval": 0.02, "start_timeout": 5.0, "address_timeout": 2.0}
STATIC_NET0 = "name=eth0,bridge=vmbr0,gw=10.77.0.1,hwaddr=BC:24:11:00:00:CA,ip=10.77.0.202/24,type=veth"


@pytest.fixture
def api() -> Iterator[StandIn]:
    backend = MemoryBackend([
        MemoryCt(200, name="trainer", addresses=["10.77.0.200/24", "fd00::200/64"], config={
            "cores": 8, "memory": 65536, "mp0": "/tank/datasets,mp=/data", "dev0": "/dev/nvidia0,gid=44",
            "dev1": "/dev/nvidiactl", "lxc": [["lxc.cgroup2.devices.allow", "c 195:* rwm"],
                                             ["lxc.environment", f"HF_TOKEN={SECRET}"]],
        }),
        MemoryCt(201, running=False, addresses=["10.77.0.201/24"]),
        MemoryCt(202, running=False, config={"net0": STATIC_NET0}),
    ])
    tokens = {
        "root@pam!orch": Token(SECRET),
        "ci@pve!blind": Token(SECRET.replace("0", "1"), frozenset()),
        "ci@pve!audit": Token(SECRET.replace("0", "2"), frozenset({"VM.Audit"})),
    }
    with start_standin(backend, tokens=tokens, token_id="root@pam!orch", qemu={300: "win11"},
                       other_nodes=["pve2"]) as standin:
        yield standin


def client_for(api: StandIn, token_id: str = "root@pam!orch", **kwargs) -> ProxmoxClient:
    options = {"verify_ssl": api.cert_path, "timeout": 5.0, **kwargs}
    return ProxmoxClient(api.host, api.port, token_id=token_id, token_secret=api.tokens[token_id].secret, **options)


def failure(fn: Callable[[], object], kind: type[OrchError] = ProxmoxError) -> OrchError:
    """Run ``fn``, expect ``kind``, and check that no token secret leaks into what the user sees."""
    with pytest.raises(kind) as info:
        fn()
    error = info.value
    assert error.hint, f"no hint on {error!r}"
    seen = " ".join([str(error), repr(error), error.hint, repr(error.__cause__), repr(error.__context__)])
    for secret in (SECRET, SECRET.replace("0", "1"), SECRET.replace("0", "2")):
        assert secret not in seen
    return error


def test_resolves_a_running_ct(api: StandIn) -> None:
    ct = resolve_ct(client_for(api), 200, **FAST)
    assert (ct.vmid, ct.node, ct.name, ct.status, ct.address, ct.started) == (200, "pve1", "trainer", "running", "10.77.0.200", False)
    summary = ct.config_summary
    assert (summary["cores"], summary["memory"], summary["mounts"]) == (8, 65536, {"mp0": "/tank/datasets,mp=/data"})
    assert summary["devices"] == {"dev0": "/dev/nvidia0,gid=44", "dev1": "/dev/nvidiactl"}
    assert summary["gpus"] == ["/dev/nvidia0", "/dev/nvidiactl", "lxc.cgroup2.devices.allow: c 195:* rwm"]
    assert "lxc.environment: HF_TOKEN=<redacted>" in summary["lxc"] and SECRET not in repr(summary)
    assert ct.hostname == "trainer" and ct.hwaddrs == ("bc:24:11:00:00:c8",)  # what the machine answering must be


def test_stopped_ct_is_refused_without_start(api: StandIn) -> None:
    questions: list[str] = []
    error = failure(lambda: resolve_ct(client_for(api), 201, interactive_confirm=lambda q: questions.append(q) or False,
                                       **FAST), CtNotRunning)
    assert "CT 201 is stopped" in str(error) and "orch deploy --start" in error.hint
    assert questions and "CT 201" in questions[0] and "Start it?" in questions[0]
    assert api.backend.status(201) == "stopped"
    assert ("POST", "/api2/json/nodes/pve1/lxc/201/status/start") not in api.requests


def test_stopped_ct_started_when_confirmed(api: StandIn) -> None:
    ct = resolve_ct(client_for(api), 201, interactive_confirm=lambda q: True, **FAST)
    assert ct.started and ct.status == "running" and ct.address == "10.77.0.201"


def test_start_polls_task_status_and_address(api: StandIn) -> None:
    faults = api.faults
    faults.task_status_400_polls, faults.task_running_polls, faults.status_lag_polls, faults.link_local_polls = 1, 3, 2, 4
    faults.task_exitstatus = "WARNINGS: 1"
    ct = resolve_ct(client_for(api), 201, start=True, **FAST)
    assert (ct.started, ct.status, ct.address) == (True, "running", "10.77.0.201")
    count = lambda suffix: sum(1 for _, path in api.requests if path.endswith(suffix))
    assert count("/status") == 1 + 3 + 1
    assert count("/status/current") == 1 + 2 + 1
    assert count("/interfaces") == 4 + 1


def test_start_of_a_dhcp_ct_that_never_gets_an_address(api: StandIn) -> None:
    api.backend.cts[201].addresses.clear()
    began = time.monotonic()
    error = failure(lambda: resolve_ct(client_for(api), 201, start=True, **{**FAST, "address_timeout": 0.3}), TargetError)
    assert "no usable address" in str(error) and time.monotonic() - began < 3


def test_static_net0_address_when_interfaces_are_null(api: StandIn) -> None:
    api.faults.interfaces_null = True
    ct = resolve_ct(client_for(api), 202, start=True, **{**FAST, "address_timeout": 0.1})
    assert ct.address == "10.77.0.202" and ct.started


def test_static_net0_address_when_interfaces_are_unsupported(api: StandIn) -> None:
    api.faults.interfaces_unsupported = True
    api.backend.cts[200].config["net0"] = STATIC_NET0
    assert resolve_ct(client_for(api), 200, **FAST).address == "10.77.0.202"


def test_unknown_ct(api: StandIn) -> None:
    error = failure(lambda: resolve_ct(client_for(api), 999, **FAST), NotFoundError)
    assert "CT 999 not found" in str(error) and "privilege" in error.hint and "pveum acl" in error.hint


def test_qemu_vm_is_not_a_ct(api: StandIn) -> None:
    assert "QEMU" in str(failure(lambda: resolve_ct(client_for(api), 300, **FAST), InputError))


def test_token_that_sees_nothing(api: StandIn) -> None:
    error = failure(lambda: resolve_ct(client_for(api, "ci@pve!blind"), 200, **FAST), NotFoundError)
    assert "CT 200 not found" in str(error) and "sees no guests" in str(error)
    assert "VM.Audit" in error.hint and "privilege separation" in error.hint


def test_bad_token_is_a_401(api: StandIn) -> None:
    client = ProxmoxClient(api.host, api.port, token_id="root@pam!orch", token_secret=SECRET[::-1],
                           verify_ssl=api.cert_path)
    error = failure(lambda: resolve_ct(client, 200, **FAST))
    assert isinstance(error, ProxmoxApiError) and error.status == 401
    assert "root@pam!orch" in str(error) and "ORCH_PROXMOX_TOKEN" in error.hint and SECRET[::-1] not in str(error)


def test_start_without_power_privilege_is_a_403(api: StandIn) -> None:
    error = failure(lambda: resolve_ct(client_for(api, "ci@pve!audit"), 201, start=True, **FAST))
    assert "Permission check failed (/vms/201, VM.PowerMgmt)" in str(error)
    assert "VM.PowerMgmt" in error.hint and "/vms/201" in error.hint


def test_tls_verification_failure_and_cert_path(api: StandIn) -> None:
    error = failure(lambda: client_for(api, verify_ssl=True).get("nodes"))
    assert "TLS verification" in str(error) and "self-signed" in str(error)
    assert 'verify_ssl = "/path/to/pve-root-ca.pem"' in error.hint
    assert client_for(api, verify_ssl=api.cert_path).get("nodes")[0]["node"] == "pve1"


def test_node_offline_is_a_595(api: StandIn) -> None:
    api.faults.node_offline = True
    error = failure(lambda: resolve_ct(client_for(api), 200, **FAST))
    assert isinstance(error, ProxmoxApiError) and error.status == 595
    assert "unreachable" in str(error) and "offline" in error.hint


def test_not_a_cluster_node_is_a_596_and_wrong_node_passes_the_reason_through(api: StandIn) -> None:
    client = client_for(api)
    error = failure(lambda: client.get("nodes", "pve.example.com", "lxc", 200, "config"))
    assert "596" in str(error) and "no such cluster node" in str(error) and "pvecm nodes" in error.hint
    error = failure(lambda: client.get("nodes", "pve2", "lxc", 200, "status", "current"))
    assert "Configuration file 'nodes/pve2/lxc/200.conf' does not exist" in str(error)


def test_start_task_that_fails(api: StandIn) -> None:
    api.faults.task_fails = True
    error = failure(lambda: resolve_ct(client_for(api), 201, start=True, **FAST))
    assert "startup for container '201' failed" in str(error) and "UPID:pve1:" in error.hint


def test_start_task_that_never_finishes(api: StandIn) -> None:
    api.faults.task_never_finishes = True
    began = time.monotonic()
    error = failure(lambda: resolve_ct(client_for(api), 201, start=True, **{**FAST, "start_timeout": 0.4}))
    assert "did not finish" in str(error) and time.monotonic() - began < 3


def test_start_of_a_running_ct_passes_the_reason_through(api: StandIn) -> None:
    error = failure(lambda: client_for(api).post("nodes", "pve1", "lxc", 200, "status", "start"))
    assert "CT 200 already running" in str(error)


def test_slow_server_times_out_within_the_configured_timeout(api: StandIn) -> None:
    api.faults.delay = 3.0
    began = time.monotonic()
    error = failure(lambda: resolve_ct(client_for(api, timeout=0.3), 200, **FAST))
    assert time.monotonic() - began < 1.5
    assert "did not answer" in str(error) and "0.3 s" in str(error)


def test_connection_refused() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = ProxmoxClient("127.0.0.1", port, token_id="root@pam!orch", token_secret=SECRET)
    assert "connection refused" in str(failure(lambda: client.get("nodes")))
    assert SECRET not in repr(client)


def test_malformed_token_id() -> None:
    error = failure(lambda: ProxmoxClient("127.0.0.1", token_id="root@pam", token_secret=SECRET), ConfigError)
    assert "USER@REALM!TOKENNAME" in str(error)


def test_load_token_from_env_and_from_a_private_file(tmp_path) -> None:
    assert load_token("root@pam!orch", env={"ORCH_PROXMOX_TOKEN": f" {SECRET}\n"}) == SECRET
    path = tmp_path / "token"
    path.write_text(SECRET + "\n")
    os.chmod(path, 0o600)
    assert load_token("root@pam!orch", env={}, token_file=str(path)) == SECRET
    os.chmod(path, 0o400)
    assert load_token("root@pam!orch", env={}, token_file=str(path)) == SECRET


def test_load_token_refuses_a_readable_file(tmp_path) -> None:
    path = tmp_path / "token"
    path.write_text(SECRET)
    os.chmod(path, 0o644)
    error = failure(lambda: load_token("root@pam!orch", env={}, token_file=str(path)), ConfigError)
    assert "0644" in str(error) and error.hint == f"chmod 600 {path}"


def test_load_token_missing_explains_how_to_make_one(tmp_path) -> None:
    error = failure(lambda: load_token("root@pam!orch", env={}), ConfigError)
    assert "pveum user token add root@pam orch" in error.hint and "VM.Audit" in error.hint and "VM.PowerMgmt" in error.hint
    error = failure(lambda: load_token("root@pam!orch", env={}, token_file=str(tmp_path / "absent")), ConfigError)
    assert "does not exist" in str(error)


def test_pick_address_prefers_global_ipv4() -> None:
    lo = {"name": "lo", "inet": "127.0.0.1/8", "ip-addresses": [{"ip-address": "127.0.0.1", "ip-address-type": "inet", "prefix": 8}]}
    eth0 = {"name": "eth0", "inet6": "fd00::5/64", "ip-addresses": [
        {"ip-address": "fe80::1", "ip-address-type": "inet6", "prefix": 64},
        {"ip-address": "fd00::5", "ip-address-type": "inet6", "prefix": 64},
        {"ip-address": "169.254.3.4", "ip-address-type": "inet", "prefix": 16},
    ]}
    eth1 = {"name": "eth1", "inet": "192.168.7.9/24"}
    assert pick_address([lo, eth0, eth1]) == "192.168.7.9"
    assert pick_address([lo, eth0]) == "fd00::5"
    assert pick_address([lo, {"name": "eth0", "inet6": "fe80::1/64", "ip-addresses": []}]) is None


def test_static_address_and_gpu_summary_from_config() -> None:
    assert static_address({"net0": "name=eth0,ip=dhcp,ip6=auto", "net1": "bridge=vmbr1,ip=10.1.2.3/16,name=eth1"}) == "10.1.2.3"
    assert static_address({"net0": "name=eth0,ip=manual"}) is None
    summary = config_summary({
        "dev0": "path=/dev/dri/renderD128,gid=104", "dev1": "/dev/ttyUSB0", "mp1": "/dev/kfd,mp=/dev/kfd", "mp0": "local:1",
        "lxc": [["lxc.cgroup2.devices.allow", "c 226:* rwm"], ["lxc.mount.entry", "/dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file"]],
        "unprivileged": 1, "description": f"token {SECRET}",
    })
    assert list(summary["mounts"]) == ["mp0", "mp1"] and summary["unprivileged"] is True
    assert summary["gpus"] == ["/dev/dri/renderD128", "/dev/kfd", "lxc.cgroup2.devices.allow: c 226:* rwm", "/dev/nvidia-uvm"]
    assert SECRET not in repr(summary)
