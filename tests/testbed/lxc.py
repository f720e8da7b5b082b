"""Real LXC containers for the integration tests: a cached base rootfs, a bridge, CTs by vmid.

Every name is fixed (bridge ``pvetest0``, containers named by vmid at ``10.77.0.<vmid>``) so that a
rerun first removes whatever a crashed run left behind. Each container is an overlay on one shared
base, so creating or resetting one costs a fraction of a second.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

BRIDGE = "pvetest0"
BRIDGE_ADDRESS = "10.77.0.1"
PREFIX = "10.77.0."
LXC_PATH = Path("/var/lib/lxc")
CACHE_DIR = Path(os.environ.get("ORCH_TESTBED_CACHE", "/var/cache/orch-testbed"))
SUITE = "bookworm"
PACKAGES = [
    "openssh-server", "tmux", "python3", "python3-venv", "python3-numpy", "rsync", "iproute2",
    "procps", "systemd-sysv", "less",
]
MASKED_UNITS = [
    "getty@tty1.service", "console-getty.service", "systemd-timesyncd.service", "apt-daily.timer",
    "apt-daily-upgrade.timer",
]
SSHD_CONF = "HostKey /etc/ssh/ssh_host_ed25519_key\nUseDNS no\nPermitRootLogin prohibit-password\n"
COMPLETE = ".orch-testbed-complete"


class TestbedError(RuntimeError):
    """The testbed itself could not be set up; the message says which step failed."""


def sh(*argv: str, check: bool = True, input: bytes | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run a host command; a failure raises with the command and its stderr."""
    proc = subprocess.run(list(argv), input=input, capture_output=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise TestbedError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.decode(errors='replace').strip()}")
    return proc


@contextlib.contextmanager
def session_lock(path: Path = Path("/run/orch-testbed.lock"), timeout: float = 1200) -> Iterator[None]:
    """Hold the testbed for this process: the names are fixed, so two test sessions at once would
    destroy each other's containers. A second session waits for the first instead."""
    with open(path, "w") as fh:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TestbedError(f"another test session held {path} for {timeout:g} s")
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def recipe_digest(packages: list[str] = PACKAGES) -> str:
    text = "\n".join([SUITE, *packages, *MASKED_UNITS, SSHD_CONF])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def ensure_base(cache_dir: Path = CACHE_DIR, packages: list[str] = PACKAGES, prefix: str = "base") -> Path:
    """Return the base rootfs, building it with mmdebstrap only when no complete copy is cached. Two testbeds
    that start at once (``tests/testbed/instance.py``) share it: the second waits for the first's build.
    ``packages``/``prefix``: another image of the same recipe with more packages (``slurm.py``'s)."""
    base = cache_dir / f"{prefix}-{recipe_digest(packages)}"
    if (base / COMPLETE).exists():
        return base
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / f"{base.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (base / COMPLETE).exists():
            _build_base(cache_dir, base, packages)
    return base


def _build_base(cache_dir: Path, base: Path, packages: list[str] = PACKAGES) -> None:
    tmp = cache_dir / f"{base.name}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    excludes = [f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in ("man", "locale", "doc")]
    sh("mmdebstrap", "--quiet", "--variant=minbase", f"--include={','.join(packages)}", *excludes,
       SUITE, str(tmp), timeout=900)
    for key in (tmp / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    (tmp / "etc/ssh/sshd_config.d/testbed.conf").write_text(SSHD_CONF)
    for unit in MASKED_UNITS:
        link = tmp / "etc/systemd/system" / unit
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")
    (tmp / COMPLETE).write_text(recipe_digest(packages) + "\n")
    tmp.rename(base)


def lxc_problem() -> str | None:
    """Why LXC cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "the LXC testbed needs root"
    for tool in ("lxc-start", "lxc-attach", "mmdebstrap", "ssh-keygen", "sshd", "nft"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install lxc mmdebstrap openssh-server openssh-client tmux nftables)"
    return None


def ensure_bridge() -> None:
    if sh("ip", "link", "show", BRIDGE, check=False).returncode != 0:
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
    sh("ip", "addr", "replace", f"{BRIDGE_ADDRESS}/24", "dev", BRIDGE)
    sh("ip", "link", "set", BRIDGE, "up")


def remove_bridge() -> None:
    if sh("ip", "link", "show", BRIDGE, check=False).returncode == 0:
        sh("ip", "link", "del", BRIDGE)


def wait_port(address: str, port: int, timeout: float, banner: bool = True) -> float:
    """Poll until an SSH server at ``address:port`` sends its banner; return the seconds waited."""
    start = time.monotonic()
    last: Exception | None = None
    while time.monotonic() - start < timeout:
        try:
            with socket.create_connection((address, port), timeout=1) as sock:
                sock.settimeout(1)
                if not banner or sock.recv(4).startswith(b"SSH-"):
                    return time.monotonic() - start
        except OSError as exc:
            last = exc
        time.sleep(0.02)
    raise TestbedError(f"nothing answered on {address}:{port} within {timeout:g} s ({last})")


def answers(address: str, port: int, timeout: float = 1.0) -> bool:
    """One attempt: does an SSH server at ``address:port`` send its banner within ``timeout``?"""
    try:
        with socket.create_connection((address, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            return sock.recv(4).startswith(b"SSH-")
    except OSError:
        return False


@dataclass
class Container:
    """One LXC container named by its vmid, reachable at 10.77.0.<vmid>:22."""

    vmid: int
    base: Path
    authorized_key: str
    port: int = 22

    @property
    def name(self) -> str:
        return str(self.vmid)

    @property
    def address(self) -> str:
        return f"{PREFIX}{self.vmid}"

    @property
    def dir(self) -> Path:
        return LXC_PATH / self.name

    @property
    def pristine(self) -> Path:
        """The files that make this CT itself (hostname, host key, authorized key); copied on reset."""
        return self.dir / "pristine"

    @property
    def delta(self) -> Path:
        return self.dir / "delta0"

    @property
    def veth(self) -> str:
        return f"veth{self.vmid}i0"

    @property
    def host_key_line(self) -> str:
        """The known_hosts line for this CT's real host key."""
        kind, blob = (self.pristine / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()[:2]
        return f"{self.address} {kind} {blob}"

    def create(self) -> None:
        """Create the CT from scratch (any stale copy of the same name is destroyed first)."""
        self.destroy()
        (self.pristine / "etc/ssh").mkdir(parents=True)
        (self.pristine / "etc/hostname").write_text(f"ct{self.vmid}\n")
        (self.pristine / "etc/hosts").write_text(f"127.0.0.1 localhost\n127.0.1.1 ct{self.vmid}\n")
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"ct{self.vmid}",
           "-f", str(self.pristine / "etc/ssh/ssh_host_ed25519_key"))
        ssh_dir = self.pristine / "root/.ssh"
        ssh_dir.mkdir(parents=True, mode=0o700)
        (ssh_dir / "authorized_keys").write_text(self.authorized_key)
        (ssh_dir / "authorized_keys").chmod(0o600)
        (self.dir / "config").write_text(self._config())
        self._restore_delta()

    def _config(self) -> str:
        return "\n".join([
            "lxc.include = /usr/share/lxc/config/common.conf",
            "lxc.tty.dir =",
            "lxc.arch = amd64",
            f"lxc.uts.name = ct{self.vmid}",
            f"lxc.rootfs.path = overlay:{self.base}:{self.delta}",
            "lxc.tty.max = 2",
            "lxc.apparmor.profile = unconfined",
            "lxc.net.0.type = veth",
            f"lxc.net.0.link = {BRIDGE}",
            "lxc.net.0.flags = up",
            "lxc.net.0.name = eth0",
            f"lxc.net.0.veth.pair = {self.veth}",
            f"lxc.net.0.hwaddr = bc:24:11:00:00:{self.vmid % 256:02x}",
            f"lxc.net.0.ipv4.address = {self.address}/24",
            f"lxc.net.0.ipv4.gateway = {BRIDGE_ADDRESS}",
            "",
        ])

    def _restore_delta(self) -> None:
        shutil.rmtree(self.delta, ignore_errors=True)
        shutil.rmtree(self.dir / "olwork", ignore_errors=True)
        shutil.copytree(self.pristine, self.delta, symlinks=True)

    def state(self) -> str:
        proc = sh("lxc-info", "-n", self.name, "-s", "-H", check=False)
        return proc.stdout.decode().strip() if proc.returncode == 0 else "MISSING"

    def pid(self) -> int:
        return int(sh("lxc-info", "-n", self.name, "-p", "-H").stdout.decode().strip())

    def start(self, timeout: float = 20) -> float:
        """Start the CT and wait until its sshd answers; return the seconds it took."""
        begin = time.monotonic()
        if self.state() != "RUNNING":
            sh("lxc-start", "-n", self.name)
        wait_port(self.address, self.port, timeout)
        return time.monotonic() - begin

    def stop(self) -> None:
        if self.state() not in ("STOPPED", "MISSING"):
            if self.state() == "FROZEN":
                sh("lxc-unfreeze", "-n", self.name, check=False)
            sh("lxc-stop", "-n", self.name, "-k")

    def shutdown(self, timeout: int = 30) -> float:
        """A graceful stop, as ``pct shutdown`` and a node reboot do: the CT's init stops everything (SIGTERM to
        every process) and powers off; killed after ``timeout`` s. Returns the seconds it took."""
        begin = time.monotonic()
        sh("lxc-stop", "-n", self.name, "-t", str(timeout), timeout=timeout + 30)
        return time.monotonic() - begin

    def reset(self) -> float:
        """Back to pristine and running with SSH answering; return the seconds it took."""
        begin = time.monotonic()
        self.stop()
        self._restore_delta()
        self.start()
        return time.monotonic() - begin

    def destroy(self) -> None:
        if self.dir.exists() or self.state() != "MISSING":
            self.stop()
            shutil.rmtree(self.dir, ignore_errors=True)

    def freeze(self) -> None:
        sh("lxc-freeze", "-n", self.name)

    def thaw(self) -> None:
        sh("lxc-unfreeze", "-n", self.name)

    def attach(self, *argv: str, check: bool = True, input: bytes | None = None) -> subprocess.CompletedProcess:
        """Run a command inside the CT (as root, the way ``pct exec`` does)."""
        return sh("lxc-attach", "-n", self.name, "--", *argv, check=check, input=input)

    def kill_sshd(self) -> None:
        """Stop the CT's sshd by its pid file, so that connecting is refused."""
        self.attach("sh", "-c", 'kill "$(cat /run/sshd.pid)"')
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                socket.create_connection((self.address, self.port), timeout=0.5).close()
            except OSError:
                return
            time.sleep(0.05)
        raise TestbedError(f"sshd in CT {self.vmid} still answers after kill")
