"""A login the testbed refuses, as a new user meets it: no key to offer for a CT reached over SSH, and a key the
Proxmox node does not know for a CT reached through it (access = "pct"). Each error names the keys tried, and
the hint names `[ssh] identity_file` and whose authorized_keys must hold the public key."""

from __future__ import annotations

import subprocess

import pytest

from tests.integration.test_remote import remote  # noqa: F401 (fixture)

pytestmark = pytest.mark.testbed


@pytest.fixture
def keyless(tmp_path, monkeypatch):
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    home = tmp_path / "home"  # no ~/.ssh/id_* there
    home.mkdir()
    return {"HOME": str(home)}


def test_no_key_for_a_ct_over_ssh(remote, keyless):  # noqa: F811
    res = remote.run("status", "-t", "ct200", env={**keyless, "ORCH_SSH__IDENTITY_FILE": ""})
    assert res.returncode == 3, res.stderr
    error = next(ln for ln in res.stderr.splitlines() if ln.startswith("error:"))
    assert "orch has no key to offer" in error and "~/.ssh/id_ed25519" in error, error
    hint = next(ln for ln in res.stderr.splitlines() if ln.startswith("hint:"))
    assert "[ssh] identity_file" in hint and "the target's ~/.ssh/authorized_keys" in hint, hint
    assert "listens" not in res.stderr and "Traceback" not in res.stderr


def test_a_key_the_node_does_not_know_for_a_ct_through_pct(remote, keyless, tmp_path):  # noqa: F811
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    res = remote.run("status", "-t", "ct201", env={**keyless, "ORCH_SSH__IDENTITY_FILE": str(stranger)})
    assert res.returncode == 3, res.stderr
    error = next(ln for ln in res.stderr.splitlines() if ln.startswith("error:"))
    assert "the Proxmox node" in error and "refused every key offered" in error and str(stranger) in error, error
    hint = next(ln for ln in res.stderr.splitlines() if ln.startswith("hint:"))
    assert "[ssh] identity_file" in hint and "the Proxmox node's ~/.ssh/authorized_keys" in hint, hint
    assert "node_ssh.user" in hint
