"""A real OpenSSH server on 127.0.0.1 for tests that need one without the LXC testbed.

    with LoopbackSshd(tmp_path / "sshd") as sshd:   # sshd.port, sshd.key (a key it accepts), sshd.known_hosts
        ...
It knows one key (``sshd.key``), serves SFTP, and is stopped (only the process it started) on exit. Its sessions
have a home of their own (``sshd.home``).
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

SSHD = Path("/usr/sbin/sshd")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LoopbackSshd:
    def __init__(self, state: Path) -> None:
        self.state = state
        self.port = free_port()
        self.key = state / "known"
        self.known_hosts = state / "known_hosts"
        self.home = state / "home"
        self.proc: subprocess.Popen | None = None

    def host_key_line(self, host: str = "127.0.0.1", port: int | None = None) -> str:
        kind, blob = (self.state / "host.pub").read_text().split()[:2]
        return f"[{host}]:{port or self.port} {kind} {blob}\n"

    def __enter__(self) -> "LoopbackSshd":
        self.state.mkdir(parents=True)
        self.home.mkdir()
        for name in ("host", "known"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.state / name)], check=True)
        (self.state / "authorized_keys").write_text((self.state / "known.pub").read_text())
        config = self.state / "sshd_config"
        config.write_text("\n".join([
            f"ListenAddress 127.0.0.1:{self.port}", f"HostKey {self.state / 'host'}", f"PidFile {self.state / 'pid'}",
            f"AuthorizedKeysFile {self.state / 'authorized_keys'}", "PasswordAuthentication no",
            "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no", "UseDNS no",
            "Subsystem sftp internal-sftp",
            # bash run by sshd reads ~/.bashrc for every command: with the account's own home, each of the
            # thousands of commands the tests send would run whatever the machine's rc files do (a pyenv init
            # costs ~0.15 s of CPU each), which is no part of what the tests test
            f"SetEnv HOME={self.home}", ""]))
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        self.proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(config)], stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                break
            except OSError:
                assert self.proc.poll() is None and time.monotonic() < deadline, "sshd did not start"
                time.sleep(0.05)
        self.known_hosts.write_text(self.host_key_line())
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
