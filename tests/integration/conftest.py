"""The LXC testbed as pytest fixtures: real containers 200 and 201, a node with ``pct``, the API stand-in.

``testbed`` (session) builds everything once; ``ct200``/``ct201`` (function) hand a test a pristine,
running container, and ``ct_pair`` both of them, reset side by side. A container is reset once per test,
however many of these a test asks for. After every test that used the testbed, faults are undone, proxies
closed and any container that no longer answers SSH is reset, so one test's damage never leaks into the next.
Set ``ORCH_TESTBED_REQUIRED=1`` (CI does) to turn "LXC cannot run here" from a skip into an error.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.testbed import faults, lxc
from tests.testbed.lxc import Container, TestbedError
from tests.testbed.node import Node
from tests.testbed.proxy import TcpProxy

VMIDS = (200, 201)

# `make test` runs the testbed's tests in two processes at once, each with a testbed of its own
# (``tests/testbed/instance.py``), ORCH_TESTBED_SHARD=a and =b. The second testbed has no network: the files that
# install orch's dependencies from the package index are the first's alone (torch comes from the testbed's site
# folder, which ``tests/groups.py`` has ready before the second starts). With ORCH_CLAIMS (``tests/claims.py``) the
# two take the other files as they get free, longest first; without, they split them beforehand.
NEEDS_NETWORK = frozenset({"test_wheel_ct.py"})
# the longest files, longest first (CI's durations): taken first, so that what is left at the end is short
LONGEST = ("test_slurm_ct.py", "test_multinode_ct.py", "test_job_faults_ct.py", "test_notify_ct.py",
           "test_queue_ct.py", "test_ddp_example_ct.py", "test_pull_ct.py", "test_sweep_search_ct.py",
           "test_doctor_ct.py", "test_keeper_ct.py", "test_workflow_ct.py", "test_env_ct.py", "test_mlflow_ct.py",
           "test_ct_identity.py", "test_command_ct.py", "test_frozen_ct.py", "test_launch_env_ct.py",
           "test_chaos_ct.py", "test_guard_ct.py", "test_into_ct.py", "test_remote.py", "test_push_big.py",
           "test_trust_ct.py", "test_model_ct.py", "test_gc_ct.py", "test_gpus_ct.py",
           "test_checkpoint_mounts_ct.py", "test_beside_ct.py", "test_checkpoint_lineage_ct.py",
           "test_first_deploy_ct.py", "test_playbook_ct.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from tests import claims

    shard = os.environ.get("ORCH_TESTBED_SHARD")
    if shard not in ("a", "b"):
        return
    rank = {name: i for i, name in enumerate(LONGEST)}
    files = sorted(dict.fromkeys(item.path for item in items),
                   key=lambda p: (p.name not in NEEDS_NETWORK, rank.get(p.name, len(rank)), p.name))
    shared = [path for path in files if path.name not in NEEDS_NETWORK]
    if claims.folder() is not None:  # the first may take any file, the second any the network is not needed for
        mine = set(files if shard == "a" else shared)
    elif shard == "b":  # dealt out in turn beforehand, longest first
        mine = set(shared[0::2])
    else:
        mine = set(shared[1::2]) | {path for path in files if path.name in NEEDS_NETWORK}
    keep = [item for item in items if item.path in mine]
    drop = [item for item in items if item.path not in mine]
    if claims.folder() is not None:
        claims.share(config, "testbed", keep, [path for path in files if path in mine])  # the network's first
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep


class Testbed:
    """Handles on the running testbed; see the module docstring of ``tests/testbed/lxc.py``."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.key_path = str(workdir / "id_ed25519")
        self.known_hosts_path = str(workdir / "known_hosts")
        self.timings: dict[str, float] = {}
        self.cts: dict[int, Container] = {}
        self.fresh: set[int] = set()  # the CTs reset for the test now running
        self.proxies: list[TcpProxy] = []
        self.api: Any = None
        begin = time.monotonic()
        self.base = lxc.ensure_base()
        self.timings["base"] = time.monotonic() - begin
        lxc.sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "orch-testbed", "-f", self.key_path)
        self.public_key = Path(self.key_path + ".pub").read_text()
        self.node = Node(self.public_key)

    def setup(self) -> None:
        faults.clear(list(VMIDS))
        lxc.ensure_bridge()
        for vmid in VMIDS:
            self.ct(vmid)
        self.timings["node"] = self.node.start()
        self._write_known_hosts()
        self._start_api()

    def _start_api(self) -> None:
        from tests.testbed.pve_backends import LxcBackend
        from tests.testbed.pve_standin import start_standin

        self.api = start_standin(LxcBackend(), node=self.node.name)

    def _write_known_hosts(self) -> None:
        lines = [ct.host_key_line for ct in self.cts.values()] + [self.node.host_key_line]
        Path(self.known_hosts_path).write_text("\n".join(lines) + "\n")

    def ct(self, vmid: int) -> Container:
        """The container ``vmid`` (``address``, ``port``, ``host_key_line``), created and started on first use."""
        if vmid not in self.cts:
            if not 100 <= vmid <= 254:
                raise ValueError(f"testbed vmids are 100..254 (the last octet of 10.77.0.x), not {vmid}")
            ct = Container(vmid, self.base, self.public_key)
            begin = time.monotonic()
            ct.create()
            ct.start()
            self.timings.setdefault("ct_create", time.monotonic() - begin)
            self.cts[vmid] = ct
            if Path(self.known_hosts_path).exists():
                self._write_known_hosts()
        return self.cts[vmid]

    def reset(self, vmid: int) -> float:
        """Pristine, running, SSH answering; returns the seconds it took."""
        return self.ct(vmid).reset()

    def pristine(self, *vmids: int) -> list[Container]:
        """The CTs ``vmids`` pristine and running for this test: each reset once, several side by side
        (each is mostly waiting for its own boot)."""
        todo = [vmid for vmid in vmids if vmid not in self.fresh]
        if len(todo) == 1:
            self.reset(todo[0])
        elif todo:
            with ThreadPoolExecutor(len(todo)) as pool:
                list(pool.map(self.reset, todo))  # the first failure is raised
        self.fresh.update(todo)
        return [self.ct(vmid) for vmid in vmids]

    def stop(self, vmid: int) -> None:
        self.ct(vmid).stop()

    def shutdown(self, vmid: int) -> float:
        return self.ct(vmid).shutdown()

    def start(self, vmid: int) -> float:
        return self.ct(vmid).start()

    def freeze(self, vmid: int) -> None:
        self.ct(vmid).freeze()

    def thaw(self, vmid: int) -> None:
        self.ct(vmid).thaw()

    def kill_sshd(self, vmid: int) -> None:
        self.ct(vmid).kill_sshd()

    def proxy(self, host: str, port: int) -> TcpProxy:
        """A TCP proxy on 127.0.0.1 in front of ``host:port``; closed after the test."""
        proxy = TcpProxy(host, port)
        self.proxies.append(proxy)
        return proxy

    def ssh_options(self) -> list[str]:
        """Options for the OpenSSH client to reach testbed hosts with the session key, strictly checked."""
        return ["-i", self.key_path, "-o", f"UserKnownHostsFile={self.known_hosts_path}",
                "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes"]

    def access_toml(self, trust_file: str | Path, proxmox: bool = True, **ssh: Any) -> str:
        """orch.toml's ``[proxmox]`` (unless not ``proxmox``) and ``[ssh]`` tables for this testbed's API and
        hosts (``ssh``: more ``[ssh]`` keys, e.g. ``command_timeout=60``)."""
        api = self.api
        more = "".join(f"{key} = {value!r}\n" for key, value in ssh.items())
        head = (f'[proxmox]\nhost = "{api.host}"\nport = {api.port}\ntoken_id = "{api.token_id}"\n'
                f'verify_ssl = "{api.cert_path}"\n') if proxmox else ""
        return (f'{head}[ssh]\nknown_hosts = ["{self.known_hosts_path}"]\ntrust_file = "{trust_file}"\n'
                f'identity_file = "{self.key_path}"\n{more}')

    def write_ssh_config(self, path: str | Path, entries: dict[str, dict[str, Any]]) -> Path:
        """Write an ssh_config with one ``Host`` block per alias, e.g. ``{"ct200": {"HostName": ...}}``."""
        blocks = []
        for alias, options in entries.items():
            blocks.append(f"Host {alias}\n" + "".join(f"    {key} {value}\n" for key, value in options.items()))
        Path(path).write_text("\n".join(blocks))
        return Path(path)

    def heal(self) -> None:
        """Undo whatever a test did to the shared testbed (faults, proxies, frozen/stopped/broken CTs)."""
        for proxy in self.proxies:
            proxy.close()
        self.proxies.clear()
        faults.clear(list(self.cts))
        for ct in self.cts.values():
            if ct.state() == "FROZEN":
                ct.thaw()
            if ct.state() != "RUNNING" or not lxc.answers(ct.address, ct.port):
                ct.reset()

    def teardown(self) -> None:
        """Stop everything; every step runs, and the first failure is raised afterwards."""
        errors: list[BaseException] = []
        steps = [lambda: self.api and self.api.stop(), self.heal_quietly, self.node.remove]
        steps += [ct.destroy for ct in self.cts.values()]
        steps += [lxc.remove_bridge]
        for step in steps:
            try:
                step()
            except BaseException as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def heal_quietly(self) -> None:
        for proxy in self.proxies:
            proxy.close()
        faults.clear(list(self.cts))


def _unavailable(reason: str) -> None:
    message = f"LXC testbed unavailable: {reason}"
    if os.environ.get("ORCH_TESTBED_REQUIRED") == "1":
        pytest.fail(message + " (ORCH_TESTBED_REQUIRED=1)", pytrace=False)
    print(f"\n*** {message} ***", file=sys.stderr)
    pytest.skip(message)


_shared: dict[str, Any] = {"bed": None, "stack": None, "users": 0}


@pytest.fixture(scope="session")
def testbed() -> Iterator[Testbed]:
    """The running testbed. Shared per process even if another conftest imports this fixture,
    because two testbeds would fight over the same fixed container and bridge names."""
    if _shared["bed"] is None:
        problem = lxc.lxc_problem()
        if problem:
            _unavailable(problem)
        stack = contextlib.ExitStack()
        stack.enter_context(lxc.session_lock())
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="orch-testbed-")))
        try:
            bed = Testbed(workdir)
            stack.callback(bed.teardown)
            bed.setup()
        except TestbedError as exc:
            try:
                stack.close()
            finally:
                _unavailable(str(exc))
        _shared.update(bed=bed, stack=stack)
    _shared["users"] += 1
    yield _shared["bed"]
    _shared["users"] -= 1
    if _shared["users"] == 0:
        stack = _shared["stack"]
        _shared.update(bed=None, stack=None)
        stack.close()


@pytest.fixture(autouse=True)
def _heal_testbed(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "testbed" in request.fixturenames:
        bed = request.getfixturevalue("testbed")
        bed.fresh.clear()  # whatever this test did, the next one resets the CTs it asks for
        bed.heal()


@pytest.fixture
def ct200(testbed: Testbed) -> Container:
    """CT 200, reset to pristine and running."""
    return testbed.pristine(200)[0]


@pytest.fixture
def ct201(testbed: Testbed) -> Container:
    """CT 201, reset to pristine and running."""
    return testbed.pristine(201)[0]


@pytest.fixture
def ct_pair(testbed: Testbed) -> tuple[Container, Container]:
    """CTs 200 and 201, both reset to pristine and running (side by side)."""
    first, second = testbed.pristine(200, 201)
    return first, second


_slurm: dict[str, Any] = {"cluster": None, "stack": None}


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Any]:
    """A real two-node Slurm cluster (``tests/testbed/slurm.py``): CTs 210 (login, controller, node) and 211,
    with ``/shared`` in both; its SSH key and known_hosts in ``cluster.key_path``/``cluster.known_hosts_path``."""
    from tests.testbed.slurm import Cluster

    problem = lxc.lxc_problem()
    if problem:
        _unavailable(problem)
    stack = contextlib.ExitStack()
    lock = Path("/run/orch-testbed")
    lock.mkdir(parents=True, exist_ok=True)
    stack.enter_context(lxc.session_lock(lock / "slurm.lock"))
    workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="orch-slurm-")))
    key = workdir / "id_ed25519"
    try:
        lxc.sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "orch-slurm", "-f", str(key))
        cluster = Cluster(Path(str(key) + ".pub").read_text(), lxc.LXC_PATH / "slurm-shared")
        stack.callback(cluster.teardown)
        cluster.timings = {"setup": cluster.setup()}
    except TestbedError as exc:
        try:
            stack.close()
        finally:
            _unavailable(str(exc))
    cluster.key_path = str(key)
    cluster.known_hosts_path = str(workdir / "known_hosts")
    Path(cluster.known_hosts_path).write_text("".join(ct.host_key_line + "\n" for ct in cluster.nodes))
    try:
        yield cluster
    finally:
        stack.close()
        if _shared["bed"] is None:  # the testbed's own teardown removes the bridge when it is up
            lxc.remove_bridge()
