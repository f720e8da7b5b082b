"""The "Proxmox node": a private sshd on the bridge address whose PATH holds the fake ``pct``.

It runs as root on this machine, so ``pct exec`` reaches the real LXC containers exactly the way
Proxmox's does (``lxc-attach -n <vmid>``). Its state lives in one fixed folder so that a rerun can
stop a stale copy by its pid file.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from .lxc import BRIDGE_ADDRESS, TestbedError, sh, wait_port

STATE_DIR = Path("/run/orch-testbed/node")
PCT_SCRIPT = Path(__file__).with_name("pct")
NODE_NAME = "pve1"


@dataclass
class Node:
    """sshd for root at ``address:port`` accepting ``authorized_key``, with ``pct`` first on PATH."""

    authorized_key: str
    address: str = BRIDGE_ADDRESS
    port: int = 2222
    user: str = "root"
    name: str = NODE_NAME
    state_dir: Path = STATE_DIR

    @property
    def pid_file(self) -> Path:
        return self.state_dir / "sshd.pid"

    @property
    def host_key(self) -> Path:
        return self.state_dir / "ssh_host_ed25519_key"

    @property
    def host_key_line(self) -> str:
        kind, blob = self.host_key.with_suffix(".pub").read_text().split()[:2]
        return f"[{self.address}]:{self.port} {kind} {blob}"

    def start(self) -> float:
        """Start (after stopping any stale copy); return the seconds until it answered."""
        begin = time.monotonic()
        self.stop()
        shutil.rmtree(self.state_dir, ignore_errors=True)
        bin_dir = self.state_dir / "bin"
        bin_dir.mkdir(parents=True)
        (bin_dir / "pct").symlink_to(PCT_SCRIPT.resolve())
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "testbed-node", "-f", str(self.host_key))
        (self.state_dir / "authorized_keys").write_text(self.authorized_key)
        config = self.state_dir / "sshd_config"
        config.write_text("\n".join([
            f"ListenAddress {self.address}:{self.port}",
            f"HostKey {self.host_key}",
            f"PidFile {self.pid_file}",
            f"AuthorizedKeysFile {self.state_dir / 'authorized_keys'}",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "UseDNS no",
            "Subsystem sftp internal-sftp",
            f"SetEnv PATH={bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin PCT_NODE={self.name}",
            "",
        ]))
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        sh("/usr/sbin/sshd", "-t", "-f", str(config))
        sh("/usr/sbin/sshd", "-f", str(config))
        wait_port(self.address, self.port, 10)
        return time.monotonic() - begin

    def remove(self) -> None:
        """Stop it and delete its state folder."""
        self.stop()
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def stop(self) -> None:
        """Stop the sshd named in the pid file (only that process), if it runs."""
        try:
            pid = int(self.pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return
        if str(self.state_dir / "sshd_config").encode() not in cmdline:
            return
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.02)
        raise TestbedError(f"node sshd (pid {pid}) did not stop")
