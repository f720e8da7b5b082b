"""A big push as a user runs it, to a real OpenSSH server on loopback: its bytes go through the ``ssh`` binary when
one is on PATH, checked against orch's known_hosts only, and over orch's own connection when there is none.

Which way the bytes went is seen from outside: ``orch deploy --json`` says it (``pushed.over``), and a pass-through
``ssh`` first on PATH records the arguments and the config file the real client was started with."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.errors import HostKeyError
from orchestrator.launch.push import BULK
from orchestrator.reach.transport.ssh import SshTransport
from tests.conftest import tmux_socket
from tests.loopback_sshd import SSHD, LoopbackSshd

pytestmark = pytest.mark.skipif(shutil.which("ssh") is None or not SSHD.exists(),
                                reason="needs OpenSSH (ssh, sshd)")

SIZE = BULK + (4 << 20)


@pytest.fixture
def sshd(tmp_path: Path):
    tmux = shutil.which("tmux") or "tmux"  # now: a test may leave PATH without it until after this ends
    with LoopbackSshd(tmp_path / "sshd") as server:
        yield server
        # the runs deployed to ``box`` live in the tmux server of its root, which the project fixture does not
        # know: left alone, each test's server and its standby agent would outlive the suite
        subprocess.run([tmux, "-L", tmux_socket(str(server.state / "root")), "kill-server"], capture_output=True)


def big_project(project, sshd, ssh_config: str = "") -> Path:
    """The project with a data file just over the bulk size (sparse, its head random), sent to ``box``."""
    data = project.path / "data"
    data.mkdir()
    with open(data / "big.bin", "wb") as fh:
        fh.write(os.urandom(1 << 16))
        fh.truncate(SIZE)
    (sshd.state / "ssh_config").write_text(ssh_config)
    project.configure(extra=f'\n[targets.box]\nkind = "ssh"\nhost = "127.0.0.1"\nport = {sshd.port}\n'
                            f'user = "root"\nroot = "{sshd.state / "root"}"\n\n'
                            f'[ssh]\nconfig_file = "{sshd.state / "ssh_config"}"\n'
                            f'known_hosts = ["{sshd.known_hosts}"]\nidentity_file = "{sshd.key}"\n'
                            'connect_retries = 0\n')
    text = (project.path / "orch.toml").read_text().replace('sources = ["train.py"]', 'sources = ["train.py", "data"]')
    (project.path / "orch.toml").write_text(text)
    return data / "big.bin"


def recording_ssh(folder: Path) -> Path:
    """A folder whose ``ssh`` writes its arguments and the ``-F`` file it was given to ``ssh.log``, then runs the
    real client with them."""
    folder.mkdir()
    real = shutil.which("ssh")
    script = folder / "ssh"
    script.write_text(f"""#!{sys.executable}
import os, sys
args = sys.argv[1:]
config = open(args[args.index("-F") + 1]).read() if "-F" in args else ""
with open({str(folder / "ssh.log")!r}, "a") as fh:
    fh.write(repr(args) + "\\n" + config + "\\n--\\n")
os.execv({real!r}, [{real!r}, *args])
""")
    script.chmod(0o755)
    return folder


def deployed_blob(sshd, path: Path, result: dict) -> str:
    rev = result["experiment"]["revision"]
    return hashlib.sha256((sshd.state / "root" / "revisions" / rev / "data" / path.name).read_bytes()).hexdigest()


def stop(project) -> None:
    assert project.run("stop", "-t", "box").returncode == 0


def test_a_big_push_goes_through_openssh_with_orchs_known_hosts_and_strict_checking(project, sshd, tmp_path):
    big = big_project(project, sshd)
    bin_dir = recording_ssh(tmp_path / "bin")
    proc = project.run("deploy", "-t", "box", "--json", env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["pushed"]["over"] == "openssh" and result["pushed"]["bytes"] >= SIZE
    assert deployed_blob(sshd, big, result) == hashlib.sha256(big.read_bytes()).hexdigest()
    log = (bin_dir / "ssh.log").read_text()
    assert log.count("\n--\n") == 1  # one ssh for the push; everything else on orch's own connection
    assert "'-F'" in log and "orch-target" in log
    assert "StrictHostKeyChecking yes" in log and f'UserKnownHostsFile "{sshd.known_hosts}"' in log
    assert "GlobalKnownHostsFile /dev/null" in log and "UpdateHostKeys no" in log
    assert f"IdentityFile \"{sshd.key}\"" in log and f"Port {sshd.port}" in log
    assert sshd.known_hosts.read_text() == sshd.host_key_line()  # nothing recorded by OpenSSH
    args = ast.literal_eval(log.splitlines()[0])
    assert not Path(args[args.index("-F") + 1]).parent.exists()  # the call's config file went with the call
    stop(project)


def test_a_big_push_through_a_jump_host_checks_the_jump_against_orchs_known_hosts_too(project, sshd, tmp_path):
    """The jump host (the same sshd, forwarding to itself) is named ``orch-hop-0`` only in orch's config file and
    is in no known_hosts of root's own: the jump's ``ssh -W`` reaches it only by reading that file too."""
    big = big_project(project, sshd, ssh_config=f"Host jump\n  HostName 127.0.0.1\n  Port {sshd.port}\n"
                                               "Host 127.0.0.1\n  ProxyJump root@jump\n")
    bin_dir = recording_ssh(tmp_path / "bin")
    proc = project.run("deploy", "-t", "box", "--json", env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["pushed"]["over"] == "openssh"
    assert deployed_blob(sshd, big, result) == hashlib.sha256(big.read_bytes()).hexdigest()
    log = (bin_dir / "ssh.log").read_text()
    assert "ProxyJump orch-hop-0" in log and "Host orch-hop-0\n  HostName 127.0.0.1\n" in log
    stop(project)


def test_without_ssh_on_path_a_big_push_goes_over_orchs_own_connection(project, sshd, tmp_path):
    big = big_project(project, sshd)
    empty = tmp_path / "no-ssh"
    empty.mkdir()
    proc = project.run("deploy", "-t", "box", "--json", env={"PATH": str(empty)})
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["pushed"]["over"] == "paramiko" and result["pushed"]["bytes"] >= SIZE
    assert deployed_blob(sshd, big, result) == hashlib.sha256(big.read_bytes()).hexdigest()
    stop(project)


def test_a_small_push_stays_on_the_open_connection(project, sshd, tmp_path):
    big = big_project(project, sshd)
    big.unlink()
    (big.parent / "small.bin").write_bytes(os.urandom(1 << 20))
    bin_dir = recording_ssh(tmp_path / "bin")
    proc = project.run("deploy", "-t", "box", "--json", env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stderr
    assert "over" not in json.loads(proc.stdout)["pushed"]
    assert not (bin_dir / "ssh.log").exists()
    stop(project)


def transport(sshd, known_hosts: Path, **kwargs) -> SshTransport:
    empty = sshd.state / "empty_config"
    empty.write_text("")
    return SshTransport("127.0.0.1", port=sshd.port, user="root", identity_file=str(sshd.key),
                        ssh_config_file=str(empty), known_hosts_files=[str(known_hosts)],
                        trust_file=str(sshd.state / "trusted"), connect_retries=0, **kwargs)


def test_openssh_refuses_an_unknown_host_key_and_records_nothing(sshd):
    unknown = sshd.state / "other_known_hosts"
    unknown.write_text("")
    with transport(sshd, unknown) as t:
        with pytest.raises(HostKeyError) as caught:
            t.run_bulk(["cat"], open=lambda: [b"x" * 1000])
    assert "OpenSSH refused the host key" in caught.value.message and "host key is known" in caught.value.message
    assert unknown.read_text() == "" and not (sshd.state / "trusted").exists()
    assert t.stats.extra.get("bulk") != "paramiko"  # refused: never tried the other way


def test_openssh_refuses_a_changed_host_key(sshd, tmp_path):
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    kind, blob = (tmp_path / "other.pub").read_text().split()[:2]
    changed = sshd.state / "changed_known_hosts"
    changed.write_text(f"[127.0.0.1]:{sshd.port} {kind} {blob}\n")
    with transport(sshd, changed) as t:
        with pytest.raises(HostKeyError) as caught:
            t.run_bulk(["cat"], open=lambda: [b"x" * 1000])
    assert "OpenSSH refused the host key" in caught.value.message
    assert changed.read_text() == f"[127.0.0.1]:{sshd.port} {kind} {blob}\n"


def test_trust_new_host_records_the_key_by_orchs_policy_before_openssh_checks_it(sshd):
    unknown = sshd.state / "other_known_hosts"
    unknown.write_text("")
    with transport(sshd, unknown, trust_new_host=True) as t:
        result = t.run_bulk(["wc", "-c"], open=lambda: [b"x" * 1000, b"y" * 24])
    assert result.ok and result.stdout.strip() == b"1024" and t.stats.extra["bulk"] == "openssh"
    assert (sshd.state / "trusted").read_text().split()[1:] == sshd.host_key_line().split()[1:]


@pytest.mark.parametrize("way", ["openssh", "paramiko"])
def test_a_file_that_ends_before_its_range_is_an_input_error_either_way(sshd, tmp_path, monkeypatch, way):
    from orchestrator.errors import InputError
    from orchestrator.reach.transport.base import FileRange

    if way == "paramiko":
        monkeypatch.setenv("PATH", str(tmp_path))  # no ssh here
    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(3 << 20))
    fd = os.open(data, os.O_RDONLY)
    try:
        with transport(sshd, sshd.known_hosts) as t:
            whole = t.run_bulk(["sha256sum"], open=lambda: [FileRange(fd, 0, 2 << 20, "data.bin"),
                                                            FileRange(fd, 2 << 20, 1 << 20, "data.bin")])
            assert whole.stdout.split()[0].decode() == hashlib.sha256(data.read_bytes()).hexdigest()
            assert t.stats.extra["bulk"] == way
            with pytest.raises(InputError) as caught:
                t.run_bulk(["cat"], open=lambda: [FileRange(fd, 1 << 20, 3 << 20, "data.bin")])
    finally:
        os.close(fd)
    assert caught.value.message == "data.bin shrank while it was being sent"


def test_with_a_keeper_holding_the_connection_a_big_push_still_goes_through_openssh(project, sshd, tmp_path):
    """The second deploy finds the keeper the first started: its small calls go through the keeper, and its big
    stream on an ssh of its own, never relayed byte by byte through the keeper."""
    big = big_project(project, sshd)
    bin_dir = recording_ssh(tmp_path / "bin")
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    for _ in range(50):  # the first status starts the keeper; one after it goes through it
        assert project.run("status", "-t", "box", env=env).returncode == 0
        listed = json.loads(project.run("connections", "list", "--json").stdout)
        if listed["keepers"] and listed["keepers"][0]["connections"]:
            break
        time.sleep(0.1)
    before = listed["keepers"][0]["connections"][0]["commands"]
    proc = project.run("deploy", "-t", "box", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["pushed"]["over"] == "openssh"
    assert deployed_blob(sshd, big, result) == hashlib.sha256(big.read_bytes()).hexdigest()
    keepers = json.loads(project.run("connections", "list", "--json").stdout)["keepers"]
    assert keepers[0]["connections"][0]["commands"] >= before + 2  # the probe and the launch went through it
    stop(project)
