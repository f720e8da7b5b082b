"""The agent runs nothing on a machine that is not the CT a request expects, and says what it is instead."""

from __future__ import annotations

import json
import os

import pytest

from orchestrator.agent.machine import identity
from orchestrator.agent.serving import validate
from orchestrator.agent.__main__ import handle
from orchestrator.agent.protocol import AgentFailure


def _expect(root: str, **over) -> dict:
    who = identity.facts(root)
    return {"vmid": 350, "node": "pve1", "hostname": who["hostname"], "hwaddrs": who["hwaddrs"][:1],
            "cluster": "pve.lan:8006", "machine_id": None, "record": True, **over}


def _request(root: str, expect: dict, ops: list | None = None) -> dict:
    return {"v": 1, "root": root, "ops": ops or [{"op": "hello", "args": {}}], "expect": expect}


def test_this_machine_passes_and_gets_orchs_mark_on_first_contact(tmp_path):
    root = str(tmp_path)
    answer = handle(_request(root, _expect(root)), None)
    assert answer["results"][0]["ok"] and "fatal" not in answer
    mark = json.loads((tmp_path / identity.MARK).read_text())
    assert mark == {"vmid": 350, "node": "pve1", "cluster": "pve.lan:8006", "machine_id": answer["who"]["machine_id"]}
    before = (tmp_path / identity.MARK).stat().st_mtime_ns
    handle(_request(root, _expect(root, record=False)), None)  # a remembered lookup writes nothing
    handle(_request(root, _expect(root)), None)  # nor does a mark that is already this
    assert (tmp_path / identity.MARK).stat().st_mtime_ns == before


@pytest.mark.parametrize("over, said", [
    ({"hostname": "ct351"}, "its hostname is"),
    ({"hwaddrs": ["bc:24:11:00:01:5f"]}, "is not CT 350's (bc:24:11:00:01:5f)"),
    ({"machine_id": "0123456789abcdef0123456789abcdef"}, "is not the 0123456789ab… orch saw on CT 350"),
    ({"vmid": 351}, "orch recorded this machine as CT 350"),
])
def test_another_machine_runs_nothing_and_says_what_it_is(tmp_path, over, said):
    root = str(tmp_path)
    compared = next(iter(over))
    if compared in ("hwaddrs", "machine_id") and not identity.facts(root)[compared]:
        pytest.skip(f"this machine has no {compared} to compare")
    handle(_request(root, _expect(root)), None)  # marked as CT 350
    stop = [{"op": "run_stop", "args": {"project": "p", "ids": None, "stop_timeout": 1, "term_timeout": 1}}]
    answer = handle(_request(root, _expect(root, **over), stop), None)
    assert answer["results"] == [] and answer["fatal"]["kind"] == "identity", answer
    assert said in answer["fatal"]["message"] and answer["who"]["hostname"] == os.uname().nodename
    assert not (tmp_path / "runs").exists() and not (tmp_path / ".lock").exists()  # touched nothing


def test_a_config_hostname_with_a_domain_is_the_cts_short_name(tmp_path):
    root = str(tmp_path)
    fqdn = identity.facts(root)["hostname"].split(".")[0].upper() + ".lab.example"
    assert "fatal" not in handle(_request(root, _expect(root, hostname=fqdn)), None)


def test_a_mark_a_clone_copied_is_not_taken_for_the_clones_own(tmp_path):
    root = str(tmp_path)
    who = identity.facts(root)
    copied = {"vmid": 351, "node": "pve1", "cluster": "pve.lan:8006", "machine_id": "f" * 32}  # its original's
    (tmp_path / identity.MARK).write_text(json.dumps(copied))
    answer = handle(_request(root, _expect(root)), None)  # hostname and MAC are this machine's: it is CT 350
    assert "fatal" not in answer and answer["who"]["mark"]["machine_id"] == who["machine_id"]


def test_a_request_without_expect_is_checked_by_nothing(tmp_path):
    answer = handle({"v": 1, "root": str(tmp_path), "ops": [{"op": "hello", "args": {}}]}, None)
    assert "who" not in answer and answer["results"][0]["ok"]


@pytest.mark.parametrize("expect", ["350", {"vmid": "350"}, {"vmid": 350, "hwaddrs": "bc:24"},
                                    {"vmid": 350, "hostname": 7}])
def test_a_malformed_expect_is_refused(tmp_path, expect):
    with pytest.raises(AgentFailure):
        validate.request({"v": 1, "root": str(tmp_path), "ops": [], "expect": expect})
