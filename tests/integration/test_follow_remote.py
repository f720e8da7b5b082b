"""`orch logs --follow` over a real SSH connection that is cut mid-stream (a TCP proxy, killed)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.integration.test_remote import ROOT, RemoteProject, on_ct  # noqa: F401 (fixture helpers)

pytestmark = pytest.mark.testbed

WRITER = """\
import sys, time
for i in range(30000):
    sys.stdout.write(f"step={i} loss={1 + (i % 7) / 10:.4f} tok/s={1000 + i % 13} pad={'x' * (i % 50)}\\n")
    if i % 300 == 0:
        sys.stdout.flush()
        time.sleep(0.1)  # ~10 s of writing: the cuts fall while it runs
"""


@pytest.fixture
def cut_project(testbed, tmp_path, monkeypatch, ct200):
    monkeypatch.setenv("ORCH_PROXMOX_TOKEN", testbed.api.token_secret)
    path = tmp_path / "proj"
    path.mkdir()
    (path / "train.py").write_text(WRITER)
    proj = RemoteProject(path, testbed)
    proxy = testbed.proxy("10.77.0.200", 22)
    host_key = testbed.ct(200).host_key_line.split(" ", 1)[1]
    proj.write(extra=f'\n[targets.cut]\nkind = "proxmox"\nct = 200\naddress = "127.0.0.1"\nport = {proxy.port}\n')
    proj.known_hosts.write_text(proj.known_hosts.read_text() + f"[127.0.0.1]:{proxy.port} {host_key}\n")
    return proj, proxy


def test_follow_survives_a_cut_connection_byte_for_byte(cut_project, testbed):
    proj, proxy = cut_project
    res = proj.cli("deploy", "--target", "cut")
    assert res.exit_code == 0, res.output
    follower = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "logs", "--target", "cut", "-f",
                                 "-n", "100000"], cwd=proj.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: follower.stdout.read(65536), b"")))
    reader.start()  # drain stdout as it comes, so the follower is never blocked writing
    deadline = time.monotonic() + 60
    while not chunks and time.monotonic() < deadline:  # following (a loaded machine starts Python slowly)
        time.sleep(0.05)
    time.sleep(0.5)
    for _ in range(2):  # cut it twice while the run is writing fast, once mid-call (stalled first)
        proxy.stall()
        time.sleep(0.8)
        proxy.kill()
        time.sleep(1.0)
    follower.wait(timeout=180)  # a follower that never ends fails the test instead of hanging it
    err = follower.stderr.read()
    reader.join(timeout=30)
    out = b"".join(chunks)
    assert follower.returncode == 0, err.decode()
    on_target = testbed.ct(200).attach("cat", f"{ROOT}/runs/{proj.run_key(1)}/train.log").stdout
    assert len(on_target) > 500_000
    assert out == on_target
    assert b"connection lost" in err and b"resuming at byte" in err
    assert b"experiment 1 finished (exit code 0)" in err


def test_ctrl_c_stops_following_not_the_run(cut_project, testbed):
    proj, _ = cut_project
    proj.path.joinpath("train.py").write_text("import time\nwhile True:\n    print('tick', flush=True)\n"
                                              "    time.sleep(0.1)\n")
    assert proj.cli("deploy", "--target", "cut").exit_code == 0
    follower = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "logs", "--target", "cut", "-f"],
                                cwd=proj.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: follower.stdout.read1(4096), b"")))
    reader.start()
    deadline = time.monotonic() + 60
    while b"tick" not in b"".join(chunks):  # following for real before the Ctrl-C
        assert time.monotonic() < deadline and follower.poll() is None, b"".join(chunks)
        time.sleep(0.1)
    follower.send_signal(signal.SIGINT)
    follower.wait(timeout=30)
    err = follower.stderr.read()
    reader.join(timeout=30)
    assert follower.returncode == 0 and b"the run goes on" in err, err
    status = proj.cli("status", "--target", "cut", "--json")
    assert '"state": "running"' in status.stdout
    assert proj.cli("stop", "--target", "cut").exit_code == 0
