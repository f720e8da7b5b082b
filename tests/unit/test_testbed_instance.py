"""The second testbed's namespaces (``tests/testbed/instance.py``): its own network with only loopback, its own
``/var/lib/lxc`` and lock file, nothing of it visible outside, and a refusal to bind-mount anything when it is
run without fresh namespaces."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.testbed.instance import RUN, STATE, places, wrap

REPO = Path(__file__).resolve().parent.parent.parent
needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                reason="namespaces need root and util-linux's unshare")


def _mounts() -> str:
    return Path("/proc/self/mountinfo").read_text()


@needs_root
def test_the_instance_has_its_own_network_lxc_folder_and_lock():
    name = f"t{os.getpid()}"
    probe = ("import os, pathlib, socket\n"
             "print(sorted(n for _, n in socket.if_nameindex()))\n"
             "pathlib.Path('/var/lib/lxc/probe').write_text('x')\n"
             "print(os.stat('/run/orch-testbed.lock').st_ino)\n")
    try:
        res = subprocess.run(wrap(name, [sys.executable, "-c", probe]), cwd=REPO, capture_output=True, text=True,
                             timeout=60)
        assert res.returncode == 0, res.stderr
        links, inode = res.stdout.splitlines()
        assert links == "['lo']"  # no bridge, no veth of the testbed outside
        assert (STATE / name / "lxc" / "probe").read_text() == "x"  # written through the bind mount
        assert not Path("/var/lib/lxc/probe").exists()
        assert int(inode) == os.stat(RUN / name / "lock").st_ino
        assert str(STATE / name) not in _mounts()  # the mounts went with the namespace
    finally:
        shutil.rmtree(STATE / name, ignore_errors=True)
        shutil.rmtree(RUN / name, ignore_errors=True)


def _instance_mounts(name: str) -> list[str]:
    """The lines of this namespace's mount table an instance named ``name`` would add: over one of its places or
    the two /sys folders, or from its own folders. Other tests running beside this one mount and unmount things of
    their own, so the whole table is not compared."""
    points = {str(target) for _, target in places(name)} | {"/sys/class/net", "/sys/devices/virtual/net"}
    own = (str(STATE / name), str(RUN / name))
    return [line for line in _mounts().splitlines()
            if line.split()[4] in points or any(place in line for place in own)]


def test_run_directly_it_refuses_and_mounts_nothing():
    before = _instance_mounts("direct")
    res = subprocess.run([sys.executable, "-m", "tests.testbed.instance", "direct", "--", "true"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "fresh namespaces" in res.stderr, res.stderr
    assert _instance_mounts("direct") == before and not (STATE / "direct").exists()


def test_a_bad_name_is_refused():
    with pytest.raises(ValueError, match="lowercase letters or digits"):
        wrap("../x", ["true"])
