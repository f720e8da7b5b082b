"""Roots that belong to the user, on a real container: the agent's bootstrap refuses a root others could write."""

from __future__ import annotations

import pytest

from tests.integration.test_remote import ROOT, on_ct, remote  # noqa: F401 - the fixture

pytestmark = pytest.mark.testbed


def test_a_world_writable_root_on_a_ct_is_refused_and_accepted_once_fixed(remote, testbed):  # noqa: F811
    assert remote.cli("status", "--ct", "200").exit_code == 0  # pushes the agent
    on_ct(testbed, 200, "chmod", "0777", ROOT)
    res = remote.cli("status", "--ct", "200")
    assert res.exit_code == 6, res.output
    assert f"refusing to run orch's agent from {ROOT}: it is writable by other users (owner root, mode 0777)" \
        in res.output and "hint: " in res.output
    on_ct(testbed, 200, "chmod", "0755", ROOT)
    assert remote.cli("status", "--ct", "200").exit_code == 0
