"""The loopback OpenSSH server the CLI tests use as an SSH target (``tests/loopback_sshd.py``)."""

from __future__ import annotations

import getpass
import os
import subprocess
from pathlib import Path


def test_a_command_through_it_runs_in_a_home_of_its_own_not_the_accounts(tmp_path: Path) -> None:
    # bash run by sshd reads ~/.bashrc for every command: the account's would add its cost to each one
    from tests.loopback_sshd import LoopbackSshd

    with LoopbackSshd(tmp_path / "sshd") as sshd:
        out = subprocess.run(
            ["ssh", "-i", str(sshd.key), "-p", str(sshd.port), "-o", "BatchMode=yes",
             "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={sshd.known_hosts}",
             f"{getpass.getuser()}@127.0.0.1", "echo HOME=$HOME"],
            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL, check=True).stdout
    assert f"HOME={sshd.home}" in out.splitlines()
    assert str(sshd.home) != os.path.expanduser("~" + getpass.getuser())
