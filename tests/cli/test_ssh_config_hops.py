"""An SSH hop as the SSH config describes it (``sshconfig``), to a real OpenSSH server on loopback, each case in a
fresh Python as a command that connects would be: paramiko loads without invoke (``sshlib``), and a ``Match exec``
block still applies, invoke loaded then; ``user@host:port`` in the host reads as ssh reads it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from orchestrator.errors import InputError
from orchestrator.reach.transport.sshconfig import split_host
from tests.loopback_sshd import SSHD, LoopbackSshd

pytestmark = pytest.mark.skipif(shutil.which("ssh") is None or not SSHD.exists(), reason="needs OpenSSH (sshd)")

REPO = Path(__file__).resolve().parents[2]

# connect as a command does (a fresh process), run `id -un`, and say which libraries the process loaded
CONNECT = textwrap.dedent("""\
    import json, sys
    sys.path.insert(0, sys.argv[1])
    from orchestrator.reach.transport.ssh import SshTransport
    host, port, key, known, config = sys.argv[2:7]
    with SshTransport(host, port=int(port) if port else None, identity_file=key or None, known_hosts_files=[known],
                      trust_file=known, ssh_config_file=config) as t:
        out = t.run(["id", "-un"]).stdout.decode().strip()
        description = t.description
    print(json.dumps({"user": out, "description": description, "invoke": "invoke" in sys.modules,
                      "fabric": "fabric" in sys.modules, "paramiko": "paramiko" in sys.modules}))
""")


@pytest.fixture
def sshd(tmp_path: Path):
    with LoopbackSshd(tmp_path / "sshd") as server:
        yield server


def connect(sshd, host: str, config: str, *, port: int | None = None, key: bool = True) -> dict:
    path = sshd.state / "ssh_config"
    path.write_text(config)
    proc = subprocess.run([sys.executable, "-c", CONNECT, str(REPO), host, str(port or ""),
                           str(sshd.key) if key else "", str(sshd.known_hosts), str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def me() -> str:
    import getpass

    return getpass.getuser()


def test_a_connecting_process_loads_paramiko_without_invoke_or_fabric(sshd):
    got = connect(sshd, "box", f"Host box\n    HostName 127.0.0.1\n    Port {sshd.port}\n    IdentityFile {sshd.key}\n")
    assert got["user"] == me() and got["description"] == f"{me()}@127.0.0.1:{sshd.port}"
    assert got["paramiko"] and not got["invoke"] and not got["fabric"]


def test_a_match_exec_block_applies_and_loads_invoke_then(sshd):
    # the block whose command fails comes first: taken, its Port 1 would win and the connection fail
    config = (f"Match host box exec \"false\"\n    Port 1\n"
              f"Match host box exec \"test -d /\"\n    HostName 127.0.0.1\n    Port {sshd.port}\n"
              f"Host box\n    IdentityFile {sshd.key}\n")
    got = connect(sshd, "box", config, key=False)
    assert got["description"] == f"{me()}@127.0.0.1:{sshd.port}" and got["user"] == me()
    assert got["invoke"]  # loaded for the Match exec lines, and only then


def test_user_and_port_in_the_host_read_as_ssh_reads_them(sshd):
    got = connect(sshd, f"{me()}@127.0.0.1:{sshd.port}", "")
    assert got["description"] == f"{me()}@127.0.0.1:{sshd.port}" and got["user"] == me()


# a ProxyCommand: relays its stdin and stdout to host:port, and leaves a mark that it ran
RELAY = textwrap.dedent("""\
    import os, socket, sys, threading
    open(sys.argv[3], "w").write("relayed")
    sock = socket.create_connection((sys.argv[1], int(sys.argv[2])))
    def up():
        while data := os.read(0, 65536):
            sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
    threading.Thread(target=up, daemon=True).start()
    while data := sock.recv(65536):
        os.write(1, data)
""")


def test_a_user_in_the_host_still_finds_the_hosts_proxy_command(sshd):
    relay, mark = sshd.state / "relay.py", sshd.state / "relayed"
    relay.write_text(RELAY)
    config = (f"Host box\n    HostName 127.0.0.1\n    Port {sshd.port}\n    IdentityFile {sshd.key}\n"
              f"    ProxyCommand {sys.executable} {relay} %h %p {mark}\n")
    got = connect(sshd, f"{me()}@box", config, key=False)
    assert got["user"] == me() and got["description"] == f"{me()}@127.0.0.1:{sshd.port}"
    assert mark.read_text() == "relayed"  # the route came from `Host box`, not from a host named "user@box"


def test_a_user_or_port_named_twice_is_an_input_error():
    assert split_host("root@gpu1:2222", None, None) == ("gpu1", "root", 2222)
    assert split_host("fe80::1", None, 22) == ("fe80::1", None, 22)  # an IPv6 address keeps its colons
    assert split_host("root@gpu1", "root", None) == ("gpu1", "root", None)  # the same user twice is one user
    with pytest.raises(InputError, match="user is named twice"):
        split_host("root@gpu1", "ubuntu", None)
    with pytest.raises(InputError, match="port is named twice"):
        split_host("gpu1:2222", None, 22)
    with pytest.raises(InputError, match="not a port number"):
        split_host("gpu1:ssh", None, None)


def _ssh_g(config: Path, alias: str) -> dict:
    """What OpenSSH itself resolves for ``alias`` (``ssh -G``): hostname, port and user."""
    out = subprocess.run(["ssh", "-F", str(config), "-G", alias], capture_output=True, text=True, timeout=30,
                         check=True).stdout
    got = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    return {"host": got["hostname"], "port": int(got["port"]), "user": got["user"]}


def test_include_resolves_each_host_as_ssh_g_does(tmp_path):
    from orchestrator.reach.transport.sshconfig import Connection, load, lookup

    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "10-gpu.conf").write_text("Host gpu1\n    HostName 10.1.2.3\n    Port 2222\n")
    (tmp_path / "conf.d" / "20-all.conf").write_text("Host gpu*\n    User trainer\n    Port 2200\n")
    (tmp_path / "inner.conf").write_text("Port 2301\n")
    config = tmp_path / "config"
    config.write_text(f"Include {tmp_path}/conf.d/*.conf {tmp_path}/missing-*.conf\n"
                      "Host gpu2\n    HostName 10.1.2.4\n"
                      f"Host box\n    Include \"{tmp_path}/inner.conf\"\n    User boxer\n"  # scoped to box
                      "Host *\n    User fallback\n")
    settings = lookup(load(str(config)))
    for alias in ("gpu1", "gpu2", "box", "other", "elsewhere"):
        hop = Connection(alias, settings)
        assert {"host": hop.host, "port": hop.port, "user": hop.user} == _ssh_g(config, alias), alias
    assert Connection("gpu1", settings).host == "10.1.2.3"  # from the included file, not the alias
    # a file with blocks of its own included inside a block: both conditions at once, which is refused by name
    (tmp_path / "inner.conf").write_text("Host other\n    Port 2302\n")
    with pytest.raises(InputError, match=f"includes {tmp_path}/inner.conf inside `Host box`"):
        load(str(config))


def test_a_host_from_an_included_file_is_reached(sshd):
    (sshd.state / "hosts.conf").write_text(f"Host box\n    HostName 127.0.0.1\n    Port {sshd.port}\n")
    got = connect(sshd, "box", f"Include {sshd.state}/hosts.conf\nHost *\n    IdentityFile {sshd.key}\n")
    assert got["user"] == me() and got["description"] == f"{me()}@127.0.0.1:{sshd.port}"


def test_an_include_loop_is_an_input_error(tmp_path):
    from orchestrator.reach.transport.sshconfig import load

    (tmp_path / "config").write_text(f"Include {tmp_path}/config\n")
    with pytest.raises(InputError, match="included more than 16 deep"):
        load(str(tmp_path / "config"))
