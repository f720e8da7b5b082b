"""`orch gc` on a real container (CT 200 over SSH): it frees what it listed and keeps the live run whole."""

from __future__ import annotations

import json

import pytest

from tests.conftest import STUBBORN
from tests.integration.test_remote import CKPT, ROOT, on_ct, remote, wait_state  # noqa: F401  (the fixture)

pytestmark = pytest.mark.testbed


def _deploy(remote, *args: str) -> dict:
    res = remote.cli("deploy", "--json", *args)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)["experiment"]


def test_gc_on_a_ct_frees_what_it_listed_and_keeps_the_live_run(remote, testbed):
    remote.write(steps=20, sleep=0.0)
    train = remote.path / "train.py"
    original = train.read_text()
    old = []
    for i in range(2):
        train.write_text(original + f"\n# variant {i}\n")
        old.append(_deploy(remote, *(["--clean-checkpoints", "--yes"] if i else []))["revision"])
        wait_state(remote, [], ("finished",))
    train.write_text(STUBBORN)
    live = _deploy(remote)
    wait_state(remote, [], ("running",))
    on_ct(testbed, 200, "find", f"{ROOT}/blobs", f"{ROOT}/revisions", "-exec", "touch", "-h", "-d", "2 hours ago",
          "{}", "+")
    checkpoints = on_ct(testbed, 200, "find", CKPT, f"{CKPT}.trash", "-printf", "%p %s\n")

    res = remote.cli("gc", "--keep", "1", "--dry-run", "--json")
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    listed = {(i["kind"], i["name"]) for i in plan["items"]}
    assert {("run", "1"), ("run", "2")} | {("revision", r) for r in old} <= listed
    assert ("revision", live["revision"]) not in listed and plan["freed"] > 0

    res = remote.cli("gc", "--keep", "1", "--yes", "--json")
    assert res.exit_code == 0, res.output
    done = json.loads(res.stdout)
    assert {(i["kind"], i["name"]) for i in done["items"]} == listed and done["freed"] == plan["freed"]
    left = on_ct(testbed, 200, "ls", f"{ROOT}/revisions", f"{ROOT}/runs").split()
    assert live["revision"] in left and remote.run_key(live["id"]) in left and not set(old) & set(left)
    assert on_ct(testbed, 200, "find", CKPT, f"{CKPT}.trash", "-printf", "%p %s\n") == checkpoints
    assert wait_state(remote, [], ("running",))["experiment"] == live["id"]
    res = remote.cli("restart", "--json")
    assert res.exit_code == 0, res.output
    assert wait_state(remote, [], ("running",))["experiment"] == live["id"] + 1
    assert remote.cli("stop").exit_code == 0
