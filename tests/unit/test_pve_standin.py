"""The Proxmox API stand-in answers in the schema's shapes and with PVE's error behaviour.

The shapes are checked against ``pve_api_subset.json`` (the PVE 9.1 API viewer data), found via
``ORCH_PVE_API_SCHEMA``, ``tests/data/`` or the ``shared/pve-api/`` folder next to the checkout.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.testbed.pve_backends import LxcBackend, MemoryBackend, MemoryCt
from tests.testbed.pve_standin import StandIn, Token, start_standin

REPO = Path(__file__).resolve().parents[2]
SCHEMA_CANDIDATES = [
    os.environ.get("ORCH_PVE_API_SCHEMA", ""),
    str(REPO / "tests" / "data" / "pve_api_subset.json"),
    str(REPO.parent / "shared" / "pve-api" / "pve_api_subset.json"),
]
UPID = re.compile(r"UPID:(?P<node>[\w.-]+):[0-9A-F]{8}:[0-9A-F]{8}:[0-9A-F]{8}:(?P<type>\w+):(?P<id>\d+):(?P<user>[^:]+):")


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    for candidate in SCHEMA_CANDIDATES:
        if candidate and os.path.isfile(candidate):
            with open(candidate, encoding="utf-8") as fh:
                return json.load(fh)["endpoints"]
    pytest.skip("pve_api_subset.json not found; set ORCH_PVE_API_SCHEMA to its path")


@pytest.fixture
def api():
    backend = MemoryBackend([
        MemoryCt(200, addresses=["10.77.0.200/24"], config={
            "net0": "name=eth0,bridge=vmbr0,gw=10.77.0.1,hwaddr=BC:24:11:00:00:C8,ip=10.77.0.200/24,type=veth",
            "mp0": "/srv/data,mp=/data", "dev0": "/dev/nvidia0", "lxc": [["lxc.cgroup2.devices.allow", "c 195:* rwm"]],
        }),
        MemoryCt(201, running=False),
    ])
    tokens = {
        "root@pam!orch": Token("11111111-2222-3333-4444-555555555555"),
        "ci@pve!blind": Token("66666666-7777-8888-9999-000000000000", frozenset()),
        "ci@pve!audit": Token("aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee", frozenset({"VM.Audit"})),
    }
    with start_standin(backend, tokens=tokens, token_id="root@pam!orch", qemu={300: "win11"},
                       other_nodes=["pve2"]) as standin:
        yield standin


def call(api: StandIn, method: str, path: str, token: str | None = None, **params: Any) -> requests.Response:
    token = token or api.token_id
    secret = api.tokens[token].secret
    return requests.request(method, f"{api.base_url}{path}", params=params if method == "GET" else None,
                            data=params if method != "GET" else None, verify=api.cert_path, timeout=5,
                            headers={"Authorization": f"PVEAPIToken={token}={secret}"})


def data(response: requests.Response) -> Any:
    assert response.status_code == 200, (response.status_code, response.reason)
    return response.json()["data"]


def check(value: Any, spec: dict[str, Any], where: str = "data") -> None:
    """Validate ``value`` against a PVE schema node: type, enum, required keys, nested items."""
    kind = spec.get("type")
    if kind == "null" or (value is None and spec.get("optional")):
        return
    if kind == "array":
        assert isinstance(value, list), f"{where}: expected array, got {value!r}"
        for i, item in enumerate(value):
            if "items" in spec:
                check(item, spec["items"], f"{where}[{i}]")
    elif kind == "object":
        assert isinstance(value, dict), f"{where}: expected object, got {value!r}"
        props = spec.get("properties", {})
        for key, sub in props.items():
            if not sub.get("optional") and "[n]" not in key:
                assert key in value, f"{where}: required key {key!r} missing"
        for key, item in value.items():
            sub = props.get(key) or props.get(re.sub(r"\d+$", "[n]", key))
            if sub is not None:
                check(item, sub, f"{where}.{key}")
    elif kind == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), f"{where}: expected integer, got {value!r}"
    elif kind == "number":
        assert isinstance(value, (int, float)) and not isinstance(value, bool), f"{where}: expected number, got {value!r}"
    elif kind == "boolean":
        assert value in (0, 1, True, False), f"{where}: expected boolean, got {value!r}"
    elif kind == "string":
        assert isinstance(value, str), f"{where}: expected string, got {value!r}"
    if "enum" in spec:
        assert value in spec["enum"], f"{where}: {value!r} not in {spec['enum']}"


def returns(schema: dict[str, Any], path: str, method: str = "GET") -> dict[str, Any]:
    return schema[path]["info"][method]["returns"]


def test_read_endpoints_match_the_schema(api: StandIn, schema: dict[str, Any]) -> None:
    resources = data(call(api, "GET", "/cluster/resources", type="vm"))
    check(resources, returns(schema, "/cluster/resources"))
    assert {(r["type"], r["vmid"]) for r in resources} == {("lxc", 200), ("lxc", 201), ("qemu", 300)}
    check(data(call(api, "GET", "/cluster/resources")), returns(schema, "/cluster/resources"))
    check(data(call(api, "GET", "/nodes")), returns(schema, "/nodes"))
    for vmid in (200, 201):
        base = f"/nodes/pve1/lxc/{vmid}"
        check(data(call(api, "GET", f"{base}/status/current")), returns(schema, "/nodes/{node}/lxc/{vmid}/status/current"))
        check(data(call(api, "GET", f"{base}/config")), returns(schema, "/nodes/{node}/lxc/{vmid}/config"))
    check(data(call(api, "GET", "/nodes/pve1/lxc/200/interfaces")), returns(schema, "/nodes/{node}/lxc/{vmid}/interfaces"))
    assert data(call(api, "GET", "/nodes/pve1/lxc/201/interfaces")) is None  # stopped: null, as PVE answers
    config = data(call(api, "GET", "/nodes/pve1/lxc/200/config"))
    assert config["lxc"] == [["lxc.cgroup2.devices.allow", "c 195:* rwm"]] and config["digest"]


def test_power_and_task_endpoints_match_the_schema(api: StandIn, schema: dict[str, Any]) -> None:
    upid = data(call(api, "POST", "/nodes/pve1/lxc/201/status/start"))
    check(upid, returns(schema, "/nodes/{node}/lxc/{vmid}/status/start", "POST"))
    match = UPID.fullmatch(upid)
    assert match and match["node"] == "pve1" and match["type"] == "vzstart" and match["id"] == "201"
    assert match["user"] == "root@pam!orch"
    spec = returns(schema, "/nodes/{node}/tasks/{upid}/status")
    first = data(call(api, "GET", f"/nodes/pve1/tasks/{upid}/status"))
    check(first, spec)
    assert first["status"] == "running" and "exitstatus" not in first
    second = data(call(api, "GET", f"/nodes/pve1/tasks/{upid}/status"))
    check(second, spec)
    assert (second["status"], second["exitstatus"], second["upid"]) == ("stopped", "OK", upid)
    assert api.backend.status(201) == "running"
    for vmid, action in ((200, "stop"), (201, "shutdown")):
        upid = data(call(api, "POST", f"/nodes/pve1/lxc/{vmid}/status/{action}"))
        check(upid, returns(schema, f"/nodes/{{node}}/lxc/{{vmid}}/status/{action}", "POST"))
        assert UPID.fullmatch(upid)["type"] == f"vz{action}"
        assert data(call(api, "GET", f"/nodes/pve1/tasks/{upid}/status"))["status"] == "running"
        assert data(call(api, "GET", f"/nodes/pve1/tasks/{upid}/status"))["exitstatus"] == "OK"
        assert api.backend.status(vmid) == "stopped"


@pytest.mark.parametrize(
    ("method", "path", "token", "status", "reason"),
    [
        ("GET", "/nodes/pve1/lxc/999/status/current", None, 500, "Configuration file 'nodes/pve1/lxc/999.conf' does not exist"),
        ("GET", "/nodes/pve2/lxc/200/config", None, 500, "Configuration file 'nodes/pve2/lxc/200.conf' does not exist"),
        ("POST", "/nodes/pve1/lxc/200/status/start", None, 500, "CT 200 already running"),
        ("POST", "/nodes/pve1/lxc/201/status/stop", None, 500, "CT 201 not running"),
        ("POST", "/nodes/pve1/lxc/201/status/start", "ci@pve!audit", 403, "Permission check failed (/vms/201, VM.PowerMgmt)"),
        ("GET", "/nodes/pve1/lxc/200/config", "ci@pve!blind", 403, "Permission check failed (/vms/200, VM.Audit)"),
        ("GET", "/nodes/pve9/lxc/200/config", None, 596, "no such cluster node 'pve9'"),
    ],
)
def test_errors_are_reason_phrases_with_a_null_body(api: StandIn, method: str, path: str, token: str | None,
                                                     status: int, reason: str) -> None:
    response = call(api, method, path, token)
    assert (response.status_code, response.reason) == (status, reason)
    assert response.json() == {"data": None}


def test_wrong_secret_is_a_401_and_missing_auth_too(api: StandIn) -> None:
    for header in ("PVEAPIToken=root@pam!orch=wrong", "", "PVEAPIToken=nobody@pam!x=11111111-2222-3333-4444-555555555555"):
        response = requests.get(f"{api.base_url}/nodes", headers={"Authorization": header}, verify=api.cert_path, timeout=5)
        assert (response.status_code, response.reason) == (401, "authentication failure")


def test_token_without_privileges_sees_empty_lists(api: StandIn) -> None:
    assert data(call(api, "GET", "/cluster/resources", "ci@pve!blind", type="vm")) == []
    assert [r["vmid"] for r in data(call(api, "GET", "/cluster/resources", "ci@pve!audit", type="vm"))] == [200, 201, 300]


def test_node_offline_is_a_595_and_shows_in_the_node_list(api: StandIn) -> None:
    api.faults.node_offline = True
    response = call(api, "GET", "/nodes/pve1/lxc/200/status/current")
    assert response.status_code == 595 and "No route to host" in response.reason
    assert {n["node"]: n["status"] for n in data(call(api, "GET", "/nodes"))} == {"pve1": "offline", "pve2": "online"}


def test_task_faults_400_first_then_failure_exitstatus(api: StandIn) -> None:
    api.faults.task_status_400_polls, api.faults.task_running_polls, api.faults.task_fails = 1, 0, True
    upid = data(call(api, "POST", "/nodes/pve1/lxc/201/status/start"))
    first = call(api, "GET", f"/nodes/pve1/tasks/{upid}/status")
    assert first.status_code == 400 and "errors" in first.json() and first.json()["data"] is None
    done = data(call(api, "GET", f"/nodes/pve1/tasks/{upid}/status"))
    assert (done["status"], done["exitstatus"]) == ("stopped", "startup for container '201' failed")
    assert api.backend.status(201) == "stopped"


def test_task_that_never_finishes(api: StandIn) -> None:
    api.faults.task_never_finishes = True
    upid = data(call(api, "POST", "/nodes/pve1/lxc/201/status/start"))
    assert all(data(call(api, "GET", f"/nodes/pve1/tasks/{upid}/status"))["status"] == "running" for _ in range(4))


def test_interfaces_link_local_only_for_the_first_polls_after_a_start(api: StandIn) -> None:
    api.faults.link_local_polls, api.faults.task_running_polls = 2, 0
    upid = data(call(api, "POST", "/nodes/pve1/lxc/201/status/start"))
    assert data(call(api, "GET", f"/nodes/pve1/tasks/{upid}/status"))["exitstatus"] == "OK"
    polls = [data(call(api, "GET", "/nodes/pve1/lxc/201/interfaces")) for _ in range(3)]
    eth0 = [next(i for i in p if i["name"] == "eth0") for p in polls]
    assert [a["ip-address"][:5] for a in eth0[0]["ip-addresses"]] == ["fe80:"] and "inet" not in eth0[0]
    assert eth0[1] == eth0[0]
    assert "inet" not in eth0[2]  # 201 has no IPv4 in this backend: still only link-local, now for real
    api.backend.cts[201].addresses.append("10.77.0.201/24")
    assert next(i for i in data(call(api, "GET", "/nodes/pve1/lxc/201/interfaces")) if i["name"] == "eth0")["inet"] == "10.77.0.201/24"


def test_slow_responses_delay_every_answer(api: StandIn) -> None:
    api.faults.delay = 0.4
    began = time.monotonic()
    data(call(api, "GET", "/nodes"))
    assert time.monotonic() - began >= 0.4
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.get(f"{api.base_url}/nodes", verify=api.cert_path, timeout=0.1)


def test_self_signed_certificate_fails_default_verification(api: StandIn) -> None:
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(f"{api.base_url}/nodes", timeout=5)


def test_lxc_backend_derives_pct_config_from_the_lxc_config(tmp_path: Path, schema: dict[str, Any]) -> None:
    (tmp_path / "205").mkdir()
    (tmp_path / "205" / "config").write_text(
        "lxc.include = /usr/share/lxc/config/common.conf\nlxc.uts.name = ct205\nlxc.net.0.type = veth\n"
        "lxc.net.0.link = pvetest0\nlxc.net.0.name = eth0\nlxc.net.0.hwaddr = bc:24:11:00:00:cd\n"
        "lxc.net.0.ipv4.address = 10.77.0.205/24  # static\nlxc.net.0.ipv4.gateway = 10.77.0.1\n"
        "lxc.cgroup2.devices.allow = c 226:* rwm\n"
    )
    (tmp_path / "notact").mkdir()
    backend = LxcBackend(lxc_path=str(tmp_path))
    assert backend.vmids() == [205]
    config = backend.config(205)
    assert config["net0"] == "name=eth0,bridge=pvetest0,gw=10.77.0.1,hwaddr=BC:24:11:00:00:CD,ip=10.77.0.205/24,type=veth"
    assert config["hostname"] == "ct205" and config["lxc"] == [["lxc.cgroup2.devices.allow", "c 226:* rwm"]]
    check({**config, "digest": "0" * 40}, returns(schema, "/nodes/{node}/lxc/{vmid}/config"))
    with pytest.raises(KeyError):
        LxcBackend([200], lxc_path=str(tmp_path)).config(205)
