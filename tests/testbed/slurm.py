"""A real two-node Slurm cluster in two LXC containers, for the ``kind = "slurm"`` tests.

CT 210 is the login node, the controller (``slurmctld``) and a compute node; CT 211 is a second compute node.
Both run Debian's ``slurmd`` and ``munge`` with one munge key, the same ``slurm.conf``/``gres.conf``, and a folder
of the host bind-mounted read-write at ``/shared`` (the cluster's shared file system). Each node has two fake GPUs
(``/dev/nvidia0``, ``/dev/nvidia1``: bind mounts of ``/dev/null``, as a passed-through device is), so ``--gres``
is scheduled and gives ``CUDA_VISIBLE_DEVICES``; there is no device and no confinement behind them.

Without cgroup delegation in the containers, ``proctrack/linuxproc`` and ``task/none`` stand in for the cgroup
plugins. The base image is the testbed's package list plus Slurm's, cached like ``lxc.ensure_base``'s; it needs
the network to be built (``tests/groups.py`` builds it before the testbed instances, which have none).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path
from typing import Iterator

from tests.testbed import lxc
from tests.testbed.lxc import Container, TestbedError

PACKAGES = [*lxc.PACKAGES, "munge", "slurmd", "slurm-client", "slurmctld"]
LOGIN, SECOND = 210, 211
SHARED = "/shared"  # the shared file system's path inside both containers
GPUS_PER_NODE = 2


def ensure_base(cache_dir: Path = lxc.CACHE_DIR) -> Path:
    """The Slurm base rootfs (built once, then cached like the testbed's own base)."""
    return lxc.ensure_base(cache_dir, packages=PACKAGES, prefix="slurm")


def slurm_conf(nodes: list[Container], *, accounting: bool = False) -> str:
    controller = nodes[0]
    lines = [
        "ClusterName=testbed",
        f"SlurmctldHost=ct{controller.vmid}({controller.address})",
        "SlurmUser=slurm", "SlurmdUser=root", "AuthType=auth/munge",
        # a requeued job waits cred_expire + 1 s before it may run again (the default, 120, made it 123 s);
        # Slurm refuses less than 5, and a credential must outlive a step's launch on a loaded machine
        "AuthInfo=cred_expire=10",
        "CryptoType=crypto/munge", "MpiDefault=none",
        # no cgroup delegation in these containers: no containment, only bookkeeping
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
        "SlurmdParameters=config_overrides",  # each container sees every host CPU: not a reason to drain
        "SchedulerType=sched/backfill",
        # the main scheduling loop every 2 s, not 60: a requeued job is started soon after its begin time (no
        # event wakes the scheduler then), where it waited up to a minute more
        "SchedulerParameters=bf_interval=5,sched_interval=2", "ReturnToService=2",
        "MinJobAge=300", "KillWait=5", "GresTypes=gpu",
        "StateSaveLocation=/var/lib/slurm/slurmctld", "SlurmdSpoolDir=/var/lib/slurm/slurmd",
        "SlurmctldPidFile=/run/slurmctld.pid", "SlurmdPidFile=/run/slurmd.pid",
        "SlurmctldLogFile=/var/log/slurm/slurmctld.log", "SlurmdLogFile=/var/log/slurm/slurmd.log",
        "AccountingStorageType=accounting_storage/none" if not accounting else "",
        "JobAcctGatherType=jobacct_gather/none",
    ]
    for ct in nodes:
        lines.append(f"NodeName=ct{ct.vmid} NodeAddr={ct.address} CPUs=2 RealMemory=1024 "
                     f"Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN")
    names = ",".join(f"ct{ct.vmid}" for ct in nodes)
    lines.append(f"PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(line for line in lines if line) + "\n"


GRES_CONF = f"AutoDetect=off\nName=gpu File=/dev/nvidia[0-{GPUS_PER_NODE - 1}]\n"


class SlurmNode(Container):
    """A testbed container that is a Slurm node: the shared folder and fake GPUs mounted, the cluster's config."""

    shared_host: Path = Path("/var/lib/lxc/slurm-shared")
    munge_ids: tuple[int, int] = (0, 0)  # munge's uid and gid in the image: its key must be its own

    def _config(self) -> str:
        extra = [f"lxc.mount.entry = {self.shared_host} {SHARED.lstrip('/')} none bind,create=dir 0 0"]
        for i in range(GPUS_PER_NODE):
            extra.append(f"lxc.mount.entry = /dev/null dev/nvidia{i} none bind,create=file 0 0")
        return super()._config() + "\n".join(extra) + "\n"

    def _restore_delta(self) -> None:
        super()._restore_delta()  # a copy: owners are not kept
        munge = self.delta / "etc/munge"
        for path in (munge, munge / "munge.key"):
            if path.exists():
                os.chown(path, *self.munge_ids)


class Cluster:
    """The two containers, started, with Slurm answering and both nodes idle."""

    def __init__(self, public_key: str, shared: Path) -> None:
        self.base = ensure_base()
        SlurmNode.shared_host = shared
        self.shared = shared
        self.nodes = [SlurmNode(vmid, self.base, public_key) for vmid in (LOGIN, SECOND)]

    @property
    def login(self) -> SlurmNode:
        return self.nodes[0]

    def setup(self) -> float:
        begin = time.monotonic()
        self.shared.mkdir(parents=True, exist_ok=True)
        lxc.ensure_bridge()
        key = os.urandom(1024)
        conf = slurm_conf(self.nodes)
        hosts = "127.0.0.1 localhost\n" + "".join(f"{ct.address} ct{ct.vmid}\n" for ct in self.nodes)
        munge_uid, munge_gid = SlurmNode.munge_ids = _ids(self.base, "munge")
        for ct in self.nodes:
            ct.create()
            for root in (ct.pristine,):
                (root / "etc/slurm").mkdir(parents=True, exist_ok=True)
                (root / "etc/slurm/slurm.conf").write_text(conf)
                (root / "etc/slurm/gres.conf").write_text(GRES_CONF)
                (root / "etc/hosts").write_text(hosts)
                munge = root / "etc/munge"
                munge.mkdir(parents=True, exist_ok=True)
                os.chown(munge, munge_uid, munge_gid)
                munge.chmod(0o700)
                (munge / "munge.key").write_bytes(key)
                (munge / "munge.key").chmod(0o400)
                os.chown(munge / "munge.key", munge_uid, munge_gid)
                if ct is not self.login:  # one controller
                    unit = root / "etc/systemd/system/slurmctld.service"
                    unit.parent.mkdir(parents=True, exist_ok=True)
                    unit.symlink_to("/dev/null")
            ct._restore_delta()
        for ct in self.nodes:
            ct.start(timeout=60)
        self.wait_idle()
        return time.monotonic() - begin

    def wait_idle(self, timeout: float = 90) -> None:
        """Until ``sinfo`` on the login node lists both nodes idle (restarting a node that will not come)."""
        deadline = time.monotonic() + timeout
        said = ""
        while time.monotonic() < deadline:
            proc = self.login.attach("sinfo", "-h", "-N", "-o", "%N %T", check=False)
            said = proc.stdout.decode() + proc.stderr.decode()
            states = dict(line.split()[:2] for line in said.splitlines() if len(line.split()) >= 2)
            if len(states) == len(self.nodes) and all(s == "idle" for s in states.values()):
                return
            for name, state in states.items():
                if state.startswith(("down", "drain")):
                    self.login.attach("scontrol", "update", f"NodeName={name}", "State=RESUME", check=False)
            time.sleep(0.5)
        raise TestbedError(f"the Slurm nodes were not idle within {timeout:g} s: {said.strip()}")

    def run(self, *argv: str, check: bool = True):
        """A command on the login node (as root), e.g. ``squeue``."""
        return self.login.attach(*argv, check=check)

    @contextlib.contextmanager
    def job_completion_log(self) -> Iterator[None]:
        """Slurm's job completion log on (``jobcomp/filetxt``: what ``sacct -c`` reads) for the ``with`` block,
        with accounting storage still off; the controller restarted each way."""
        conf = self.login.attach("cat", "/etc/slurm/slurm.conf").stdout.decode()
        logged = conf + "JobCompType=jobcomp/filetxt\nJobCompLoc=/var/log/slurm/jobcomp.log\n"
        self._controller_with(logged)
        try:
            yield
        finally:
            self._controller_with(conf)

    def _controller_with(self, conf: str) -> None:
        self.login.attach("sh", "-c", 'cat > /etc/slurm/slurm.conf', input=conf.encode())
        self.login.attach("systemctl", "restart", "slurmctld")
        self.wait_idle()

    def cancel_all(self) -> None:
        """Every job cancelled, and the nodes idle again: what one test leaves, the next never meets."""
        self.run("scancel", "--full", "--user=root", check=False)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if not self.run("squeue", "-h", "-o", "%i", check=False).stdout.strip():
                break
            time.sleep(0.5)
        self.wait_idle()

    def teardown(self) -> None:
        for ct in self.nodes:
            ct.destroy()
        shutil.rmtree(self.shared, ignore_errors=True)


def _ids(base: Path, user: str) -> tuple[int, int]:
    """``user``'s uid and gid in the base image (its own /etc/passwd, not the host's)."""
    for line in (base / "etc/passwd").read_text().splitlines():
        parts = line.split(":")
        if parts[0] == user:
            return int(parts[2]), int(parts[3])
    raise TestbedError(f"the Slurm base image has no user {user!r}")
