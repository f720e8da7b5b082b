"""A host that will not let orch in, as a new user meets it: a real OpenSSH server on loopback, started by the test,
and the real CLI with no SSH agent and no key of its own (or a key the server does not know)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.loopback_sshd import SSHD, LoopbackSshd

pytestmark = pytest.mark.skipif(shutil.which("ssh-keygen") is None or not SSHD.exists(),
                                reason="needs OpenSSH (sshd, ssh-keygen)")


@pytest.fixture
def sshd(tmp_path: Path):
    """sshd on 127.0.0.1 that knows one key (``known``), none of which the test's user has by default."""
    with LoopbackSshd(tmp_path / "sshd") as server:
        yield server.state, server.port


def configure(project, state: Path, port: int, identity: str | None = None) -> None:
    (state / "ssh_config").write_text("")
    key = f'identity_file = "{identity}"\n' if identity else ""
    project.configure(extra=f'\n[targets.box]\nkind = "ssh"\nhost = "127.0.0.1"\nport = {port}\nuser = "root"\n'
                            f'root = "{state / "root"}"\n\n[ssh]\nconfig_file = "{state / "ssh_config"}"\n'
                            f'known_hosts = ["{state / "known_hosts"}"]\nconnect_retries = 0\n{key}')


def test_no_key_at_all_says_which_keys_were_tried_and_where_the_key_goes(project, sshd, tmp_path, monkeypatch):
    state, port = sshd
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    home = tmp_path / "home"  # no ~/.ssh/id_* here
    home.mkdir()
    configure(project, state, port)
    proc = project.run("status", "-t", "box", env={"HOME": str(home)})
    assert proc.returncode == 3, proc.stderr
    error = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(error) == 1 and "orch has no key to offer" in error[0], proc.stderr
    assert "no SSH agent" in error[0] and "~/.ssh/id_ed25519" in error[0]
    hint = [ln for ln in proc.stderr.splitlines() if ln.startswith("hint:")][0]
    assert "[ssh] identity_file" in hint and "authorized_keys" in hint and "listens" not in hint, hint
    assert "Traceback" not in proc.stderr


def test_a_key_the_host_does_not_know_is_named(project, sshd, tmp_path, monkeypatch):
    state, port = sshd
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    home = tmp_path / "home"
    home.mkdir()
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    configure(project, state, port, identity=str(stranger))
    proc = project.run("status", "-t", "box", env={"HOME": str(home)})
    assert proc.returncode == 3, proc.stderr
    assert "refused every key offered" in proc.stderr and str(stranger) in proc.stderr
    assert "[ssh] identity_file" in proc.stderr and "authorized_keys" in proc.stderr

    missing = tmp_path / "no-such-key"
    configure(project, state, port, identity=str(missing))
    proc = project.run("status", "-t", "box", env={"HOME": str(home)})
    assert proc.returncode == 3, proc.stderr
    assert f"could not be offered the key {missing}" in proc.stderr and "[ssh] identity_file" in proc.stderr

    configure(project, state, port, identity=str(state / "known"))  # the right key: in
    proc = project.run("status", "-t", "box", env={"HOME": str(home)})
    assert proc.returncode == 0 and "refused" not in proc.stderr, proc.stderr
