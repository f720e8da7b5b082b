"""A host that will not let orch in, as a new user meets it: a real OpenSSH server on loopback, started by the test,
and the real CLI with no SSH agent and no key of its own (or a key the server does not know)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import threading
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


class DropsAtLogin:
    """A real SSH server (paramiko's) on loopback that completes the key exchange, then cuts the connection when
    the client offers its key: a network drop mid-login, which is no refusal of the key."""

    def __init__(self) -> None:
        import paramiko

        self.paramiko = paramiko
        self.key = paramiko.Ed25519Key.from_private_key_file(self._keygen())
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.logins = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _keygen(self) -> str:
        path = Path(tempfile.mkdtemp()) / "host_key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
        return str(path)

    def _serve(self) -> None:
        paramiko = self.paramiko
        outer = self

        class Cut(paramiko.ServerInterface):
            def __init__(self, sock: socket.socket) -> None:
                self.sock = sock

            def get_allowed_auths(self, username: str) -> str:
                return "publickey"

            def check_auth_publickey(self, username: str, key: object) -> int:
                outer.logins += 1
                self.sock.shutdown(socket.SHUT_RDWR)
                return paramiko.AUTH_FAILED

        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            transport = paramiko.Transport(sock)
            transport.add_server_key(self.key)
            try:
                transport.start_server(server=Cut(sock))
            except (paramiko.SSHException, EOFError, OSError):
                transport.close()

    def close(self) -> None:
        self.listener.close()


def test_a_connection_cut_while_logging_in_is_retried_and_never_called_a_refused_key(project, tmp_path,
                                                                                     monkeypatch):
    server = DropsAtLogin()
    try:
        monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
        state = tmp_path / "state"
        state.mkdir()
        (state / "ssh_config").write_text("")
        (state / "known_hosts").write_text(f"[127.0.0.1]:{server.port} {server.key.get_name()} "
                                           f"{server.key.get_base64()}\n")
        mine = tmp_path / "mine"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(mine)], check=True)
        project.configure(extra=f'\n[targets.box]\nkind = "ssh"\nhost = "127.0.0.1"\nport = {server.port}\n'
                                f'user = "root"\nroot = "{state / "root"}"\n\n[ssh]\n'
                                f'config_file = "{state / "ssh_config"}"\nknown_hosts = ["{state / "known_hosts"}"]\n'
                                f'connect_retries = 2\nidentity_file = "{mine}"\n')
        proc = project.run("status", "-t", "box", env={"HOME": str(tmp_path)})
        assert proc.returncode != 0
        assert server.logins == 3, (server.logins, proc.stderr)  # tried again, as any dropped connection is
        error = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
        assert len(error) == 1 and "closed the connection while orch logged in" in error[0], proc.stderr
        assert "refused" not in proc.stderr and "authorized_keys" not in proc.stderr and "Traceback" not in proc.stderr
    finally:
        server.close()
