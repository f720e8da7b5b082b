"""A second testbed beside the first: the same names (bridge ``pvetest0``, CTs 200 and 201 at 10.77.0.x, the
node on 10.77.0.1:2222, ``/run/orch-testbed.lock``), in a network namespace and a mount namespace of its own.

Inside, private folders are bind-mounted over the places the testbed keeps its state (``/var/lib/lxc``,
``/run/lxc``, ``/run/orch-testbed``, the lock file), so the tests, the fake ``pct`` and the API stand-in run
unchanged and never meet the containers of the testbed outside. The base image and the torch site are shared
(read-only, and each built under a lock). LXC names the second CT 200's cgroup ``lxc.payload.200-1``.

    python -m tests.testbed.instance NAME -- pytest ...   # runs the command inside testbed NAME

Needs root and util-linux's ``unshare``; the namespaces go away with the command's last process.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

STATE = Path("/var/lib/orch-testbed-instances")  # each instance's containers (disk: overlays)
RUN = Path("/run/orch-testbed-instances")  # each instance's node, LXC locks and session lock
NAME = re.compile(r"^[a-z0-9]{1,16}$")


def places(name: str) -> list[tuple[Path, Path]]:
    """(private source, the path it covers) for instance ``name``."""
    return [
        (STATE / name / "lxc", Path("/var/lib/lxc")),
        (RUN / name / "lxc", Path("/run/lxc")),
        (RUN / name / "state", Path("/run/orch-testbed")),
        (RUN / name / "lock", Path("/run/orch-testbed.lock")),
    ]


def wrap(name: str, argv: list[str]) -> list[str]:
    """The command line that runs ``argv`` inside testbed instance ``name``."""
    if not NAME.match(name):
        raise ValueError(f"a testbed instance name is 1-16 lowercase letters or digits, not {name!r}")
    return ["unshare", "--net", "--mount", "--propagation", "private", "--",
            sys.executable, "-m", "tests.testbed.instance", name, "--", *argv]


def _enter(name: str) -> None:
    """In the fresh namespaces: loopback up, every private place bind-mounted over its path."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    for source, target in places(name):
        if target.suffix == ".lock":
            source.parent.mkdir(parents=True, exist_ok=True)
            source.touch()
            target.touch()
        else:
            source.mkdir(parents=True, exist_ok=True)
            target.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "--bind", str(source), str(target)], check=True)
    # /sys still shows the machine's network devices, and lxc-start looks a bridge up there: a sysfs mounted in
    # this network namespace shows its own, bind-mounted over the two places that list them
    view = RUN / name / "sys"
    view.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "sysfs", "sysfs", str(view)], check=True)
    for place in ("class/net", "devices/virtual/net"):
        subprocess.run(["mount", "--bind", str(view / place), f"/sys/{place}"], check=True)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--" or not NAME.match(argv[0]):
        print("usage: python -m tests.testbed.instance NAME -- COMMAND...", file=sys.stderr)
        return 2
    parent = os.getppid()  # the caller of unshare, in the namespaces left behind
    if any(os.readlink(f"/proc/self/ns/{ns}") == os.readlink(f"/proc/{parent}/ns/{ns}") for ns in ("net", "mnt")):
        print("run through tests.testbed.instance.wrap (in fresh namespaces), not directly", file=sys.stderr)
        return 2  # never bind-mount over the machine's own /var/lib/lxc
    os.environ["ORCH_TESTBED_INSTANCE"] = argv[0]
    _enter(argv[0])
    os.execvp(argv[2], argv[2:])
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
