"""`orch logs --follow` through an outage that neither closes nor resets the connection (a real sshd on loopback
behind a TCP proxy that stops forwarding): it says on stderr that the link is lost within four keepalive
intervals, says so again when it resumes, and no line is lost or repeated."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time

import pytest

from tests.conftest import tmux_socket, wait_for
from tests.loopback_sshd import SSHD, LoopbackSshd
from tests.testbed.proxy import TcpProxy

pytestmark = pytest.mark.skipif(not SSHD.exists(), reason="needs OpenSSH's sshd")

TICKER = "import time\ni = 0\nwhile True:\n    print(f'line {i}', flush=True)\n    i += 1\n    time.sleep(0.1)\n"
KEEPALIVE = 1
OUTAGE = 12.0  # s without a byte forwarded either way


@pytest.fixture
def behind_proxy(project, tmp_path):
    with LoopbackSshd(tmp_path / "sshd") as sshd, TcpProxy("127.0.0.1", sshd.port) as proxy:
        remote = tmp_path / "remote"
        sshd.known_hosts.write_text(sshd.host_key_line(port=proxy.port))
        (project.path / "ticker.py").write_text(TICKER)
        (tmp_path / "ssh_config").write_text("")
        project.configure(extra=f'\n[targets.box]\nkind = "ssh"\nhost = "127.0.0.1"\nport = {proxy.port}\n'
                                f'user = "root"\nidentity_file = "{sshd.key}"\nroot = "{remote}"\n'
                                f'checkpoints = "{remote}/checkpoints"\n\n[ssh]\nconfig_file = "{tmp_path}/ssh_config"\n'
                                f'known_hosts = ["{sshd.known_hosts}"]\nkeepalive = {KEEPALIVE}\nconnect_timeout = 2\n')
        try:
            yield proxy
        finally:
            subprocess.run(["tmux", "-L", tmux_socket(str(remote)), "kill-server"], capture_output=True)


def test_follow_reports_a_silent_outage_and_the_resumption(project, behind_proxy):
    proxy = behind_proxy
    flags = ["-t", "box", "--set", "project.sources=['ticker.py']", "--set", "project.command=python3 ticker.py"]
    deploy = project.run("deploy", *flags)
    assert deploy.returncode == 0, deploy.stderr
    assert project.run("status", "-t", "box").returncode == 0  # through the connection keeper from here on
    follower = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "logs", "-t", "box", "-f",
                                 "-n", "100000"], cwd=project.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    out: list[str] = []
    err: list[tuple[float, str]] = []
    readers = [threading.Thread(target=lambda: out.extend(follower.stdout), daemon=True),
               threading.Thread(target=lambda: err.extend((time.monotonic(), ln) for ln in follower.stderr),
                                daemon=True)]
    for reader in readers:
        reader.start()
    try:
        wait_for(lambda: len(out) > 10, timeout=30, what="the log flowing")
        proxy.stall()
        cut = time.monotonic()
        lost = wait_for(lambda: next((t for t, ln in err if "connection lost" in ln), None), timeout=OUTAGE,
                        what="'connection lost' during the outage")
        assert lost - cut < OUTAGE  # said while the link was still down, not after it came back
        time.sleep(max(0.0, cut + OUTAGE - time.monotonic()))
        proxy.resume()
        wait_for(lambda: any("reconnected; resuming at byte" in ln for _, ln in err), timeout=60,
                 what="'reconnected' after the outage")
        seen = len(out)
        wait_for(lambda: len(out) > seen + 5, timeout=30, what="the log flowing again")
        stop = project.run("stop", "-t", "box")
        assert stop.returncode == 0, stop.stderr
        follower.wait(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    for reader in readers:
        reader.join(timeout=10)
    numbers = [int(m.group(1)) for ln in out if (m := re.fullmatch(r"line (\d+)\n", ln))]
    assert numbers == list(range(len(numbers))) and len(numbers) > 20, out[:5]  # none lost, none repeated
    assert follower.returncode == 0, [ln for _, ln in err]
