"""A 1 GiB first push to a real CT over a real SSH connection that is cut midway, then resumed.

The connection runs through a TCP proxy that the test kills once about 40% of the bytes went up.
Measured meanwhile: the peak resident memory (VmHWM) of the orch process and of the agent on the CT,
which must stay a small fraction of the tree whatever its size (the push streams 1 MiB pieces).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time

import pytest

from orchestrator.reach.agent_client import agent_zip
from tests.integration.test_remote import ROOT, RemoteProject
from tests.testbed.procs import peak_kb, pids_running

pytestmark = pytest.mark.testbed

FILES, FILE_MB = 4, 256
TRAIN = "import time\nwhile True:\n    time.sleep(1)\n"


@pytest.fixture
def big_project(testbed, tmp_path, monkeypatch, ct200):
    monkeypatch.setenv("ORCH_PROXMOX_TOKEN", testbed.api.token_secret)
    path = tmp_path / "proj"
    (path / "data").mkdir(parents=True)
    (path / "train.py").write_text(TRAIN)
    for i in range(FILES):  # sparse files, each with its own head so that no two share a blob
        with open(path / "data" / f"shard{i}.bin", "wb") as fh:
            fh.write(os.urandom(4096))
            fh.truncate(FILE_MB << 20)
    proj = RemoteProject(path, testbed)
    proxy = testbed.proxy("10.77.0.200", 22)
    host_key = testbed.ct(200).host_key_line.split(" ", 1)[1]
    proj.write(sources='["train.py", "data"]', checkpoints=None,
               extra=f'\n[targets.cut]\nkind = "proxmox"\nct = 200\naddress = "127.0.0.1"\nport = {proxy.port}\n')
    proj.known_hosts.write_text(proj.known_hosts.read_text() + f"[127.0.0.1]:{proxy.port} {host_key}\n")
    return proj, proxy


def deploy(proj, proxy, cut_at: int | None) -> tuple[subprocess.CompletedProcess, dict]:
    """``orch deploy --target cut --json`` as a real process, sampling memory; cut the link after ``cut_at`` bytes."""
    agent_name = f"agent-{agent_zip()[0]}.pyz"
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "deploy", "--target", "cut", "--json"],
                            cwd=proj.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peaks = {"controller_kb": 0, "agent_kb": 0}
    start_up = proxy.bytes_up
    while proc.poll() is None:
        peaks["controller_kb"] = max(peaks["controller_kb"], peak_kb(proc.pid))
        for pid in pids_running(agent_name):
            peaks["agent_kb"] = max(peaks["agent_kb"], peak_kb(pid))
        if cut_at is not None and proxy.bytes_up - start_up > cut_at:
            proxy.kill()
            cut_at = None
        time.sleep(0.05)
    out, err = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), peaks


def test_a_1gib_push_cut_midway_resumes_in_bounded_memory(big_project, testbed):
    proj, proxy = big_project
    total = FILES * FILE_MB << 20
    cut, first_peaks = deploy(proj, proxy, cut_at=int(total * 0.4))
    assert cut.returncode != 0
    assert "nothing was changed on the target, and what was sent is kept" in cut.stderr, cut.stderr
    assert "deploy again" in cut.stderr
    assert proj.registry().list() == []  # the push comes before the experiment is recorded

    done, second_peaks = deploy(proj, proxy, cut_at=None)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    pushed = result["pushed"]
    assert result["experiment"]["status"] == "running"
    assert pushed["missing"] >= 1 and pushed["resumed_bytes"] > 0
    assert pushed["bytes"] < total * 0.75  # what arrived before the cut was not sent again
    # every file in the revision on the CT is the local file, byte for byte
    rev = result["experiment"]["revision"]
    sums = subprocess.run(["ssh", *testbed.ssh_options(), f"root@{testbed.ct(200).address}",
                           f"cd {ROOT}/revisions/{rev} && sha256sum data/*.bin"],
                          capture_output=True, text=True, timeout=120)
    remote = dict(reversed(line.split()) for line in sums.stdout.splitlines())
    local = {f"data/shard{i}.bin": hashlib.sha256((proj.path / "data" / f"shard{i}.bin").read_bytes()).hexdigest()
             for i in range(FILES)}
    assert remote == local
    controller = max(first_peaks["controller_kb"], second_peaks["controller_kb"]) >> 10
    agent = max(first_peaks["agent_kb"], second_peaks["agent_kb"]) >> 10
    print(f"\npush of {total >> 20} MiB cut at 40%, resumed with {pushed['bytes'] >> 20} MiB: "
          f"peak RSS controller {controller} MiB, agent {agent} MiB")
    assert 0 < controller < 256 and 0 < agent < 128  # a tree 4-8x bigger than the bound
    assert proj.run("stop", "--target", "cut").returncode == 0
