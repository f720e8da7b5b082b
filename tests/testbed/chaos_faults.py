"""The chaos loop's faults on the controller's side and on the link, each undone by its own counterpart:

    runtime = Runtime.make()              # the clones' own keeper folder (XDG_RUNTIME_DIR)
    runtime.kill("keeper")                # SIGKILL the connection keeper; "warm": the warm orch process and
                                          # the command it forked
    kill_agents(ct)                       # SIGKILL every resident agent (``agent-*.pyz serve``) in the CT
    shape(200, latency="1ms")             # CT 200's link through a token bucket: slow, or one that drops
    unshape(200)
    small_folder(path); fill(path); free(path); unmount(path)   # a clone's ``.orch`` on a tmpfs, filled
    hold = Holder(db, seconds=5)          # a write transaction on a registry, ended by ``hold.stop()``
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .lxc import sh

FOLDER_SIZE = "16m"  # a clone's .orch: the registry and a few small files
FILLER = ".chaos-filler"
RATE, BURST = "100mbit", "64kb"

# who holds the registry: BEGIN IMMEDIATE takes SQLite's write lock; "held" once it has it
HOLD = """\
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], timeout=30, isolation_level=None)
db.execute("BEGIN IMMEDIATE")
print("held", flush=True)
time.sleep(float(sys.argv[2]))
db.execute("ROLLBACK")
"""


@dataclass
class Runtime:
    """The clones' runtime folder: their keeper and warm orch process listen here, and nowhere else."""

    path: Path

    @classmethod
    def make(cls) -> "Runtime":
        return cls(Path(tempfile.mkdtemp(prefix="orch-chaos-rt-", dir="/tmp")))

    def pids(self, kind: str) -> list[int]:
        """The live processes of ``kind`` (``keeper`` or ``warm``) that serve this folder. A keeper is whichever
        process listens on a keeper socket here: one started for it, or a warm process's child that became one."""
        if kind == "keeper":
            return _listening(self.path / "orch", "keeper-")
        module, sock = b"orchestrator.warm.server", b"/warm-"
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                words = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if module in words and any(w.startswith(bytes(self.path / "orch")) and sock in w for w in words):
                found.append(int(entry.name))
        return found

    def kill(self, kind: str) -> list[str]:
        """SIGKILL every ``kind`` process of this folder; for ``warm`` its process group too (the command it
        forked). What was killed, each as ``pid N (parent P) `command line```: the evidence when a command
        fails in a way the loop did not expect."""
        pids = self.pids(kind)
        killed = [_describe(pid) for pid in pids]
        for pid in pids:
            try:
                if kind == "warm":
                    os.killpg(pid, signal.SIGKILL)  # it leads a session of its own, its children with it
                else:
                    os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return killed

    def logs(self, lines: int = 6) -> str:
        """The last ``lines`` lines of each log its keeper and warm processes wrote (their stderr)."""
        found = []
        for log in sorted((self.path / "orch").glob("*.log")):
            try:
                tail = log.read_text(errors="replace").strip().splitlines()[-lines:]
            except OSError:
                continue
            if tail:
                found.append(f"{log.name}: " + " | ".join(tail))
        return "; ".join(found) or "no log lines"

    def close(self) -> None:
        self.kill("warm")
        self.kill("keeper")
        shutil.rmtree(self.path, ignore_errors=True)


def _describe(pid: int) -> str:
    try:
        words = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
        parent = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1]
    except OSError:
        return f"pid {pid} (gone)"
    return f"pid {pid} (parent {parent}) `{b' '.join(w for w in words if w).decode(errors='replace')[:160]}`"


def _listening(folder: Path, prefix: str) -> list[int]:
    """The processes that hold a listening Unix socket named ``folder/prefix*`` (its inode, in their descriptors)."""
    inodes = set()
    with open("/proc/net/unix") as fh:
        next(fh)
        for line in fh:
            fields = line.split()
            if len(fields) >= 8 and fields[7].startswith(f"{folder}/{prefix}") and int(fields[3], 16) & 0x10000:
                inodes.add(f"socket:[{fields[6]}]")  # __SO_ACCEPTCON: a listening socket
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (entry / "fd").iterdir()):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def kill_agents(ct) -> None:
    ct.attach("pkill", "-9", "-f", "agent-.*pyz serve", check=False)


def shape(vmid: int, latency: str) -> None:
    """CT ``vmid``'s host-side veth through a token bucket; a short ``latency`` means a short queue that drops."""
    sh("tc", "qdisc", "replace", "dev", f"veth{vmid}i0", "root", "tbf", "rate", RATE, "burst", BURST,
       "latency", latency)


def unshape(vmid: int) -> None:
    sh("tc", "qdisc", "del", "dev", f"veth{vmid}i0", "root", check=False)


def small_folder(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if not os.path.ismount(path):
        sh("mount", "-t", "tmpfs", "-o", f"size={FOLDER_SIZE},mode=0700", "chaos-orch", str(path))


def unmount(path: Path) -> None:
    if os.path.ismount(path):
        sh("umount", "-l", str(path), check=False)


def fill(path: Path) -> int:
    """Fill ``path``'s file system until it says ENOSPC; the bytes still free afterwards."""
    block = b"\0" * (1 << 16)
    fd = os.open(path / FILLER, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (len(block), 4096, 512, 1):
            try:
                while True:
                    os.write(fd, block[:size])
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
    finally:
        os.close(fd)
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def free(path: Path) -> None:
    (path / FILLER).unlink(missing_ok=True)


class Holder:
    """Another process holding a write transaction on the registry ``db`` for ``seconds`` (or until stopped)."""

    def __init__(self, db: Path, seconds: float) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", HOLD, str(db), str(seconds)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if line.strip() != "held":
            self.stop()
            raise RuntimeError(f"could not hold {db}: {self.proc.stderr.read().strip()}")
        self.pid = self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate()
