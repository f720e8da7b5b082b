"""A run of commands on CT 200 asks the Proxmox API once; a CT that stopped meanwhile is looked up again."""

from __future__ import annotations

import json
import os
import stat

import pytest

from tests.integration.test_remote import remote  # noqa: F401  (the fixture)

pytestmark = pytest.mark.testbed


def _lookups(testbed) -> int:
    return sum(1 for _, path in testbed.api.requests if "/lxc/200/" in path or path.endswith("/resources"))


def test_repeat_commands_reuse_the_lookup_and_a_stopped_ct_is_asked_again(remote, testbed):  # noqa: F811
    assert remote.run("deploy", "--ct", "200").returncode == 0
    cache = remote.path / ".orch" / "ct-cache.json"
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o600
    assert [k for k in json.loads(cache.read_text())] == [f"{testbed.api.host}:{testbed.api.port}/200/ssh"]
    before = _lookups(testbed)
    for argv in (("status",), ("logs", "-n", "1"), ("stop",)):
        res = remote.run(*argv)
        assert res.returncode == 0, (argv, res.stderr)
    assert _lookups(testbed) == before  # three commands, no API call: the CT's SSH port answered
    testbed.ct(200).stop()
    res = remote.run("status", "--ct", "200")
    assert res.returncode != 0 and "CT 200 is stopped" in res.stderr, res.stderr
    assert _lookups(testbed) > before  # the port no longer answered: the API was asked and said why


def _age(cache, seconds: float) -> None:
    data = json.loads(cache.read_text())
    for entry in data.values():
        entry["at"] -= seconds
    cache.write_text(json.dumps(data))


def test_a_lookup_past_its_ttl_reaches_the_ct_and_is_asked_again_after_the_answer(remote, testbed):  # noqa: F811
    """The first command after a pause: the CT's remembered lookup is stale, its port answers, so the command
    reaches it without the API; the API is asked once the answer is out (as the warm process's child does)."""
    from orchestrator import after_answer

    assert remote.run("deploy", "--ct", "200").returncode == 0
    cache = remote.path / ".orch" / "ct-cache.json"
    _age(cache, 12 * 3600)  # a night away: past cache_ttl (30 s), within cache_max_age (a week)
    aged = next(iter(json.loads(cache.read_text()).values()))["at"]
    before = _lookups(testbed)
    after_answer.hold()
    try:
        res = remote.cli("status")
        assert res.exit_code == 0, res.output
        assert _lookups(testbed) == before  # answered with no API call
    finally:
        after_answer.finish()
    assert _lookups(testbed) > before  # then asked again
    assert next(iter(json.loads(cache.read_text()).values()))["at"] > aged + 12 * 3600 - 100  # and fresh
    _age(cache, 600)
    testbed.ct(200).stop()
    res = remote.run("status", "--ct", "200")
    assert res.returncode != 0 and "CT 200 is stopped" in res.stderr, res.stderr  # its port did not answer
