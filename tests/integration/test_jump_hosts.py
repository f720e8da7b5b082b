"""Every SSH hop checked: ProxyJump jump hosts get the same strict known_hosts policy as the destination.

The testbed node's sshd (which allows TCP forwarding, like any stock sshd) is a real jump host in front of
CT 200; CT 200 is a real jump host in front of the node for the `pct` path. Host keys differ per hop, so a
hop that was not really passed through could not produce the errors asserted here.
"""

from __future__ import annotations

import base64
import time
from pathlib import Path

import pytest

from orchestrator.errors import HostKeyError, InputError, TransportError
from orchestrator.reach.transport.hostkeys import fingerprint
from orchestrator.reach.transport.ssh import SshTransport
from tests.integration.test_remote import RemoteProject, remote  # noqa: F401  (the fixture)

pytestmark = pytest.mark.testbed

BASTION = "the jump host bastion (10.77.0.1:2222)"


def key_of(line: str) -> str:
    """``type base64`` of a known_hosts line."""
    return " ".join(line.split()[1:3])


def fp(line: str) -> str:
    return fingerprint(base64.b64decode(line.split()[2]))


def ssh_config(testbed, path: Path, **entries: dict) -> str:
    """The user's ssh_config: ``bastion`` is the node; extra ``Host`` blocks as keyword arguments."""
    node = testbed.node
    blocks = {"bastion": {"HostName": node.address, "Port": node.port, "User": "root"}, **entries}
    return str(testbed.write_ssh_config(path / "ssh_config", blocks))


def via(testbed, tmp_path: Path, host: str, known: list[str], **kw) -> SshTransport:
    """A transport to ``host`` whose ssh_config routes it as given, knowing only the ``known`` lines."""
    known_hosts = tmp_path / "known_hosts"
    if not known_hosts.exists():
        known_hosts.write_text("".join(line + "\n" for line in known))
    kw.setdefault("trust_file", str(known_hosts))
    return SshTransport(host, user="root", identity_file=testbed.key_path, known_hosts_files=[str(known_hosts)],
                        ssh_config_file=str(tmp_path / "ssh_config"), connect_timeout=5, connect_retries=0, **kw)


# -- the transport ----------------------------------------------------------------------------------


def test_unknown_jump_host_key_is_refused_naming_the_jump_host(testbed, ct200, tmp_path):
    ssh_config(testbed, tmp_path, ct200={"HostName": ct200.address, "ProxyJump": "bastion"})
    with pytest.raises(HostKeyError) as info:
        via(testbed, tmp_path, "ct200", [ct200.host_key_line]).run(["true"])
    message = info.value.message
    assert message.startswith(f"unknown host key for {BASTION}: ssh-ed25519 ")
    assert fp(testbed.node.host_key_line) in message and "--trust-new-host" in info.value.hint


def test_trust_new_host_records_the_jump_host_key_then_it_is_known(testbed, ct200, tmp_path):
    ssh_config(testbed, tmp_path, ct200={"HostName": ct200.address, "ProxyJump": "bastion"})
    trust = tmp_path / "orch" / "known_hosts"
    with via(testbed, tmp_path, "ct200", [ct200.host_key_line], trust_file=str(trust), trust_new_host=True) as t:
        assert t.run(["hostname"]).stdout == b"ct200\n"
    assert trust.read_text().split() == testbed.node.host_key_line.split()
    (tmp_path / "known_hosts").unlink()
    with via(testbed, tmp_path, "ct200", [ct200.host_key_line, trust.read_text().strip()]) as t:
        assert t.run(["hostname"]).stdout == b"ct200\n"


def test_changed_jump_host_key_is_refused_even_with_trust_new_host(testbed, ct200, tmp_path):
    ssh_config(testbed, tmp_path, ct200={"HostName": ct200.address, "ProxyJump": "bastion"})
    forged = f"[{testbed.node.address}]:{testbed.node.port} {key_of(testbed.ct(201).host_key_line)}"
    for trust in (False, True):
        with pytest.raises(HostKeyError) as info:
            via(testbed, tmp_path, "ct200", [ct200.host_key_line, forged], trust_new_host=trust).run(["true"])
        assert f"host key for {BASTION} CHANGED" in info.value.message
        assert "never overrides" in info.value.hint and "ssh-keygen -R '[10.77.0.1]:2222'" in info.value.hint
    assert (tmp_path / "known_hosts").read_text().count("\n") == 2  # nothing recorded


def test_the_destination_behind_a_known_jump_host_is_still_checked(testbed, ct200, tmp_path):
    ssh_config(testbed, tmp_path, ct200={"HostName": ct200.address, "ProxyJump": "bastion"})
    with pytest.raises(HostKeyError) as info:
        via(testbed, tmp_path, "ct200", [testbed.node.host_key_line]).run(["true"])
    assert info.value.message.startswith(f"unknown host key for {ct200.address}: ")
    assert fp(ct200.host_key_line) in info.value.message


def test_two_jump_hosts_are_passed_in_order_and_each_is_checked(testbed, ct200, ct201, tmp_path):
    # ct201 first, then the node, then CT 200: CT 200 sees the node's address, the node sees CT 201's
    ssh_config(testbed, tmp_path, ct200={"HostName": ct200.address, "ProxyJump": f"root@{ct201.address},bastion"})
    with pytest.raises(HostKeyError, match=f"unknown host key for the jump host {ct201.address}:22: "):
        via(testbed, tmp_path, "ct200", [ct200.host_key_line, testbed.node.host_key_line]).run(["true"])
    (tmp_path / "known_hosts").unlink()
    with via(testbed, tmp_path, "ct200", [ct200.host_key_line], trust_new_host=True) as t:
        seen_from = t.run(["sh", "-c", "echo $SSH_CONNECTION"]).stdout.split()[0]
    assert seen_from == testbed.node.address.encode()
    recorded = (tmp_path / "known_hosts").read_text()
    assert key_of(ct201.host_key_line) in recorded and key_of(testbed.node.host_key_line) in recorded


def test_a_destination_the_jump_host_cannot_reach_is_a_transport_error_naming_both(testbed, ct200, tmp_path):
    ssh_config(testbed, tmp_path, ct200={"HostName": ct200.address, "Port": 2999, "ProxyJump": "bastion"})
    with pytest.raises(TransportError) as info:
        via(testbed, tmp_path, "ct200", [testbed.node.host_key_line]).run(["true"])
    assert info.value.message.startswith(f"{BASTION} cannot reach {ct200.address}:2999: ")
    assert "AllowTcpForwarding" in info.value.hint


def test_a_proxy_jump_loop_is_an_input_error(testbed, tmp_path):
    ssh_config(testbed, tmp_path, a={"ProxyJump": "b"}, b={"ProxyJump": "a"})
    with pytest.raises(InputError, match="ProxyJump loops: a -> b -> a"):
        via(testbed, tmp_path, "a", []).run(["true"])


# -- the real CLI -----------------------------------------------------------------------------------


def use_ssh_config(project: RemoteProject, config: str, known: list[str]) -> None:
    """Point the project's [ssh] at ``config`` and know only the ``known`` lines."""
    toml = project.path / "orch.toml"
    toml.write_text(toml.read_text().replace("[ssh]\n", f'[ssh]\nconfig_file = "{config}"\n', 1))
    project.known_hosts.write_text("".join(line + "\n" for line in known))


def test_cli_jump_host_refused_then_trusted_then_a_changed_key_refused(remote, testbed, tmp_path):
    ct = testbed.ct(200)
    use_ssh_config(remote, ssh_config(testbed, tmp_path, **{ct.address: {"ProxyJump": "bastion"}}),
                   [ct.host_key_line])
    res = remote.cli("status", "--ct", "200")
    assert res.exit_code == 3, res.output
    assert f"unknown host key for {BASTION}" in res.output and fp(testbed.node.host_key_line) in res.output
    res = remote.cli("status", "--ct", "200", "--trust-new-host")
    assert res.exit_code == 0, res.output
    assert remote.trusted.read_text().split() == testbed.node.host_key_line.split()
    assert remote.cli("status", "--ct", "200").exit_code == 0  # recorded: no flag needed any more
    forged = f"[{testbed.node.address}]:{testbed.node.port} {key_of(testbed.ct(201).host_key_line)}"
    remote.trusted.write_text(forged + "\n")
    res = remote.cli("status", "--ct", "200", "--trust-new-host")
    assert res.exit_code == 3 and f"host key for {BASTION} CHANGED" in res.output
    assert remote.trusted.read_text() == forged + "\n"


def test_cli_pct_checks_the_node_and_a_jump_host_in_front_of_it(remote, testbed, tmp_path):
    node, jump = testbed.node, testbed.ct(200)
    config = ssh_config(testbed, tmp_path, **{node.address: {"ProxyJump": f"root@{jump.address}"}})
    use_ssh_config(remote, config, [node.host_key_line])
    res = remote.cli("status", "--ct", "201")
    assert res.exit_code == 3, res.output
    assert f"unknown host key for the jump host {jump.address}:22: " in res.output
    remote.known_hosts.write_text(jump.host_key_line + "\n")
    res = remote.cli("status", "--ct", "201")
    assert res.exit_code == 3, res.output
    assert f"unknown host key for the Proxmox node {node.name} ({node.address}:{node.port})" in res.output
    res = remote.cli("status", "--ct", "201", "--trust-new-host")
    assert res.exit_code == 0, res.output
    assert remote.trusted.read_text().split() == node.host_key_line.split()
    # no jump any more: the node straight, its recorded key checked, a changed one refused
    Path(config).write_text("")
    remote.trusted.write_text(f"[{node.address}]:{node.port} {key_of(jump.host_key_line)}\n")
    res = remote.cli("status", "--ct", "201", "--trust-new-host")
    assert res.exit_code == 3 and f"host key for the Proxmox node {node.name}" in res.output
    assert "CHANGED" in res.output


def proxy_command(testbed, known_hosts: Path) -> str:
    """``ssh -W`` through the node: OpenSSH itself checks the node's key against ``known_hosts``."""
    node = testbed.node
    return (f"ssh -i {testbed.key_path} -o UserKnownHostsFile={known_hosts} -o StrictHostKeyChecking=yes "
            f"-o BatchMode=yes -o IdentitiesOnly=yes -p {node.port} -W %h:%p root@{node.address}")


def test_through_a_proxy_command_the_destination_is_still_checked(testbed, ct200, tmp_path):
    openssh_known = tmp_path / "openssh_known_hosts"
    openssh_known.write_text(testbed.node.host_key_line + "\n")
    ssh_config(testbed, tmp_path, ct200={"HostName": ct200.address,
                                         "ProxyCommand": proxy_command(testbed, openssh_known)})
    with pytest.raises(HostKeyError, match=f"unknown host key for {ct200.address}: "):
        via(testbed, tmp_path, "ct200", []).run(["true"])
    (tmp_path / "known_hosts").unlink()
    with via(testbed, tmp_path, "ct200", [ct200.host_key_line]) as t:
        assert t.run(["hostname"]).stdout == b"ct200\n"
    openssh_known.write_text("")  # the hop inside the command is OpenSSH's to check, and it refuses
    begin = time.monotonic()
    with pytest.raises(TransportError) as info:
        via(testbed, tmp_path, "ct200", []).run(["true"])
    assert not isinstance(info.value, HostKeyError) and time.monotonic() - begin < 3  # not the 5 s timeout
    assert info.value.message == f"the ProxyCommand for {ct200.address} exited with code 255: " \
                                 "Host key verification failed."
    assert "ProxyJump" in info.value.hint
