"""`orch use --ct N` against the Proxmox API stand-in: a CT that does not exist is refused and nothing changes;
one that exists becomes current; with the API out of reach it is still chosen, with a warning."""

from __future__ import annotations

import socket

import pytest

from tests.testbed.pve_backends import MemoryBackend, MemoryCt
from tests.testbed.pve_standin import Token, start_standin

SECRET = "11111111-2222-3333-4444-555555555555"


@pytest.fixture
def api():
    backend = MemoryBackend([MemoryCt(200, name="trainer", addresses=["10.77.0.200/24"]),
                             MemoryCt(201, name="spare", running=False)])
    with start_standin(backend, tokens={"root@pam!orch": Token(SECRET)}, token_id="root@pam!orch",
                       qemu={300: "win11"}) as standin:
        yield standin


def configure(project, host: str, port: int, cert: str) -> None:
    project.configure(extra=f'\n[proxmox]\nhost = "{host}"\nport = {port}\ntoken_id = "root@pam!orch"\n'
                            f'verify_ssl = "{cert}"\ntimeout = 3\n')


def current(project) -> str:
    res = project.run("use")
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_use_ct_checks_that_the_ct_exists(project, api, monkeypatch):
    monkeypatch.setenv("ORCH_PROXMOX_TOKEN", SECRET)
    configure(project, api.host, api.port, api.cert_path)
    before = current(project)
    missing = project.run("use", "--ct", "999")
    assert missing.returncode == 7, missing.stderr
    assert "error: CT 999 not found" in missing.stderr and "hint:" in missing.stderr
    assert current(project) == before and not (project.path / ".orch" / "current-target.json").exists()
    vm = project.run("use", "--ct", "300")  # a QEMU VM, not a container
    assert vm.returncode == 2 and "not an LXC container" in vm.stderr
    job = project.run("use", "--ct", "200", "--ct", "999")  # every node of a job is checked
    assert job.returncode == 7 and "CT 999 not found" in job.stderr
    assert current(project) == before

    ok = project.run("use", "--ct", "200")
    assert ok.returncode == 0, ok.stderr
    assert "CT 200" in ok.stdout and "warning" not in ok.stderr
    stopped = project.run("use", "--ct", "201")
    assert stopped.returncode == 0 and "is stopped" in stopped.stderr and "--start" in stopped.stderr
    assert "CT 201" in current(project)

    monkeypatch.setenv("ORCH_PROXMOX_TOKEN", "00000000-0000-0000-0000-000000000000")  # the API refuses it
    refused = project.run("use", "--ct", "200")
    assert refused.returncode == 3 and "error:" in refused.stderr and SECRET not in refused.stderr
    assert "CT 201" in current(project)


def test_use_ct_works_offline_with_a_warning(project, api, monkeypatch):
    monkeypatch.setenv("ORCH_PROXMOX_TOKEN", SECRET)
    with socket.socket() as s:  # a port nothing listens on: the API cannot be asked
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    configure(project, "127.0.0.1", closed, api.cert_path)
    res = project.run("use", "--ct", "999")
    assert res.returncode == 0, res.stderr
    assert "warning: CT 999 was not checked" in res.stderr and "cannot connect to the Proxmox API" in res.stderr
    assert "CT 999" in current(project)
    monkeypatch.delenv("ORCH_PROXMOX_TOKEN")  # no token here at all: chosen too, with a warning
    res = project.run("use", "--ct", "200")
    assert res.returncode == 0 and "warning: CT 200 was not checked" in res.stderr, res.stderr
