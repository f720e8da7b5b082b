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
from orchestrator.reach.transport.sshconfig import _shorthand
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
    config = (f"Match host box exec \"test -d /\"\n    HostName 127.0.0.1\n    Port {sshd.port}\n"
              f"Match host box exec \"false\"\n    Port 1\n"
              f"Host box\n    IdentityFile {sshd.key}\n")
    got = connect(sshd, "box", config, key=False)
    assert got["description"] == f"{me()}@127.0.0.1:{sshd.port}" and got["user"] == me()
    assert got["invoke"]  # loaded for the Match exec lines, and only then


def test_user_and_port_in_the_host_read_as_ssh_reads_them(sshd):
    got = connect(sshd, f"{me()}@127.0.0.1:{sshd.port}", "")
    assert got["description"] == f"{me()}@127.0.0.1:{sshd.port}" and got["user"] == me()


def test_a_user_or_port_named_twice_is_an_input_error():
    assert _shorthand("root@gpu1:2222", None, None) == ("gpu1", "root", 2222)
    assert _shorthand("fe80::1", None, 22) == ("fe80::1", None, 22)  # an IPv6 address keeps its colons
    assert _shorthand("root@gpu1", "root", None) == ("gpu1", "root", None)  # the same user twice is one user
    with pytest.raises(InputError, match="user is named twice"):
        _shorthand("root@gpu1", "ubuntu", None)
    with pytest.raises(InputError, match="port is named twice"):
        _shorthand("gpu1:2222", None, 22)
    with pytest.raises(InputError, match="not a port number"):
        _shorthand("gpu1:ssh", None, None)
