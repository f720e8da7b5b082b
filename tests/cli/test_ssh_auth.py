"""A host that will not let orch in, as a new user meets it: a real OpenSSH server on loopback, started by the test,
and the real CLI with no SSH agent and no key of its own (or a key the server does not know)."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from tests.conftest import wait_for

pytestmark = pytest.mark.skipif(shutil.which("ssh-keygen") is None or not Path("/usr/sbin/sshd").exists(),
                                reason="needs OpenSSH (sshd, ssh-keygen)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def sshd(tmp_path: Path):
    """sshd on 127.0.0.1 that knows one key (``known.pub``), none of which the test's user has by default."""
    state = tmp_path / "sshd"
    state.mkdir()
    for name in ("host", "known"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(state / name)], check=True)
    (state / "authorized_keys").write_text((state / "known.pub").read_text())
    port = free_port()
    config = state / "sshd_config"
    config.write_text("\n".join([f"ListenAddress 127.0.0.1:{port}", f"HostKey {state / 'host'}",
                                 f"PidFile {state / 'pid'}", f"AuthorizedKeysFile {state / 'authorized_keys'}",
                                 "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no",
                                 "StrictModes no", "UseDNS no", "Subsystem sftp internal-sftp", ""]))
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(config)], stderr=subprocess.DEVNULL)

    def answers() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            return proc.poll() is not None

    wait_for(answers, timeout=10, what="sshd on loopback")
    assert proc.poll() is None
    kind, blob = (state / "host.pub").read_text().split()[:2]
    (state / "known_hosts").write_text(f"[127.0.0.1]:{port} {kind} {blob}\n")
    yield state, port
    proc.terminate()
    proc.wait(timeout=10)


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
