"""Which target a command acts on: flags, the current target, the default; one identity per machine."""

from __future__ import annotations

from orchestrator.reach import current
from orchestrator.cli.main import optional_values
from orchestrator.config import load_settings, local_root
from orchestrator.reach.targets import planned_target, target_spec

TOML = """
[project]
name = "demo"

[proxmox]
host = "pve.example"
token_id = "root@pam!orch"

[targets.a]
kind = "proxmox"
ct = 311
access = "ssh"

[targets.b]
kind = "proxmox"
ct = 311
access = "pct"
"""


def settings(tmp_path):
    (tmp_path / "orch.toml").write_text(TOML)
    return load_settings(tmp_path / "orch.toml", env={})


def test_two_entries_for_one_ct_are_one_machine_and_an_ambiguous_ct_says_so(tmp_path):
    s = settings(tmp_path)
    a, b = planned_target(s, "a", s.targets["a"]), planned_target(s, "b", s.targets["b"])
    assert a.machine == b.machine and a.label == "CT 311"
    said: list[str] = []
    assert target_spec(s, ct=311, notice=said.append)[0] == "a"
    assert said == ["CT 311 matches targets a (ssh), b (pct); using a (pass --target NAME to choose)"]
    assert target_spec(s, ct=311, notice=said.append, prefer="b")[0] == "b"
    local = planned_target(s, "local", s.targets["local"])
    assert local.machine != a.machine and local.checkpoints == local_root() + "/checkpoints/demo"
    assert a.checkpoints == "/workspace/checkpoints/demo"


def test_the_current_target_file_round_trips_and_ignores_garbage(tmp_path):
    assert current.load(tmp_path) is None
    current.save(tmp_path, None, 311)
    assert current.load(tmp_path) == {"ct": 311}
    current.save(tmp_path, "a", None)
    assert current.load(tmp_path) == {"target": "a"}
    (tmp_path / current.FILE).write_text("{not json")
    assert current.load(tmp_path) is None


def test_wait_takes_an_optional_value():
    assert optional_values(["deploy", "--wait"]) == ["deploy", "--wait=60"]
    assert optional_values(["deploy", "--wait", "--json"]) == ["deploy", "--wait=60", "--json"]
    assert optional_values(["deploy", "--wait", "12.5"]) == ["deploy", "--wait", "12.5"]
    assert optional_values(["deploy", "--wait=5"]) == ["deploy", "--wait=5"]
    assert optional_values(["play", "f.yaml", "--", "--wait"]) == ["play", "f.yaml", "--", "--wait"]
