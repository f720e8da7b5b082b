"""orch pull from real CTs: over SSH into CT 200, through the node's `pct exec` into CT 201, from a job's node, and
a 500 MB pull through a TCP proxy that is killed midway, resumed, in bounded memory (peak RSS measured)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.reach.agent_client import agent_zip
from tests.integration.test_remote import CKPT, ROOT, RemoteProject, remote  # noqa: F401  (the fixture)
from tests.testbed.procs import peak_kb, pids_running

pytestmark = pytest.mark.testbed

# the checkpoint's bytes come from a seeded generator: the test knows them without reading the CT
TRAIN = """\
import hashlib, os, pathlib, random, socket
mb = int(os.environ.get("PULL_MB", "3"))
ck = pathlib.Path(os.environ["ORCH_CHECKPOINT_DIR"])
ck.mkdir(parents=True, exist_ok=True)
rng = random.Random(7)
with open(ck / "ckpt.pt.tmp", "wb") as fh:
    for _ in range(mb):
        fh.write(rng.randbytes(1 << 20))
os.replace(ck / "ckpt.pt.tmp", ck / "ckpt.pt")
out = pathlib.Path("out")
out.mkdir(exist_ok=True)
(out / "host.txt").write_text(socket.gethostname() + "\\n")
os.symlink("/etc", "out/etc")
os.symlink("/etc/passwd", "out/passwd")
print("step=1 loss=1.0", flush=True)
"""


def expected_ckpt(mb: int) -> str:
    import random

    rng, digest = random.Random(7), hashlib.sha256()
    for _ in range(mb):
        digest.update(rng.randbytes(1 << 20))
    return digest.hexdigest()


def _project(remote, mb: int = 3, extra: str = "") -> None:  # noqa: F811
    (remote.path / "train.py").write_text(TRAIN)
    remote.write(extra=extra)
    toml = remote.path / "orch.toml"
    toml.write_text(toml.read_text().replace('TINYLM_SAMPLES = "600"', f'PULL_MB = "{mb}"'))


def _finished(remote, where: tuple[str, ...], timeout: float = 120) -> None:  # noqa: F811
    deadline = time.monotonic() + timeout
    while True:
        res = remote.run("status", *where, "--json")
        if res.returncode == 0 and json.loads(res.stdout).get("state") == "finished":
            return
        assert time.monotonic() < deadline, res.stdout + res.stderr
        time.sleep(0.5)


def _deploy(remote, *where: str) -> int:  # noqa: F811
    res = remote.run("deploy", *where, "--json")
    assert res.returncode == 0, res.stderr
    exp_id = json.loads(res.stdout)["experiment"]["id"]
    _finished(remote, where)
    return exp_id


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _pulled(remote, *args: str) -> dict:  # noqa: F811
    res = remote.run("pull", *args, "--json", timeout=300)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.mark.parametrize("vmid", [200, 201], ids=["ssh", "pct"])
def test_pull_from_a_ct_is_byte_identical_sends_nothing_twice_follows_no_link(remote, testbed, vmid):  # noqa: F811
    _project(remote)
    if vmid == 201:
        testbed.kill_sshd(201)  # only pct exec reaches it
    exp_id = _deploy(remote, "--ct", str(vmid))
    first = _pulled(remote, "-e", str(exp_id))
    dest = remote.path / "orch-pull" / f"exp{exp_id}"
    run_dir = testbed.ct(vmid).delta / f"{ROOT}/runs/{remote.run_key(exp_id)}".lstrip("/")
    assert _sha(dest / "checkpoints" / "ckpt.pt") == expected_ckpt(3)
    assert (dest / "outputs" / "out" / "host.txt").read_text() == f"ct{vmid}\n"
    assert (dest / "train.log").read_bytes() == (run_dir / "train.log").read_bytes()
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()
                  and not p.name.startswith(".")) == ["checkpoints/ckpt.pt", "outputs/out/host.txt", "train.log"]
    assert {s["key"] for s in first["skipped"]} == {"outputs/out/etc", "outputs/out/passwd"}
    assert first["sent_bytes"] == (3 << 20) + len(f"ct{vmid}\n") + (run_dir / "train.log").stat().st_size

    second = _pulled(remote, "-e", str(exp_id))
    assert second["sent_bytes"] == 0 and second["summary"] == {"files": 3, "bytes": 0, "same": 3}

    (dest / "outputs" / "out" / "host.txt").write_text("changed here\n")
    refused = remote.run("pull", "-e", str(exp_id), "--outputs")
    assert refused.returncode == 5 and "outputs/out/host.txt" in refused.stderr, refused.stderr
    assert (dest / "outputs" / "out" / "host.txt").read_text() == "changed here\n"
    forced = _pulled(remote, "-e", str(exp_id), "--outputs", "--force")
    assert forced["sent_bytes"] == len(f"ct{vmid}\n")
    assert (dest / "outputs" / "out" / "host.txt").read_text() == f"ct{vmid}\n"


def _pull_sampled(proj, proxy, args: list[str], cut_at: int | None, for_good: bool = False) \
        -> tuple[subprocess.CompletedProcess, int]:
    """``orch pull`` as a real process, its peak RSS sampled; the link cut after ``cut_at`` bytes came down (and,
    ``for_good``, the proxy closed: no new connection either)."""
    agent_name = f"agent-{agent_zip()[0]}.pyz"
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "pull", *args, "--json"],
                            cwd=proj.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak, agent_peak = 0, 0
    start = proxy.bytes_down
    while proc.poll() is None:
        peak = max(peak, peak_kb(proc.pid))
        for pid in pids_running(agent_name):
            agent_peak = max(agent_peak, peak_kb(pid))
        if cut_at is not None and proxy.bytes_down - start > cut_at:
            proxy.close() if for_good else proxy.kill()
            cut_at = None
        time.sleep(0.02)
    out, err = proc.communicate()
    print(f"\npeak RSS: orch {peak >> 10} MiB, agent {agent_peak >> 10} MiB")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), peak


def _through(remote, testbed, proxy) -> None:  # noqa: F811
    """Target ``cut`` reaches CT 200 through ``proxy``."""
    host_key = testbed.ct(200).host_key_line.split(" ", 1)[1]
    toml = remote.path / "orch.toml"
    head, _, _ = toml.read_text().partition("\n[targets.cut]")
    toml.write_text(head + f'\n[targets.cut]\nkind = "proxmox"\nct = 200\naddress = "127.0.0.1"\nport = {proxy.port}\n')
    remote.known_hosts.write_text(remote.known_hosts.read_text() + f"[127.0.0.1]:{proxy.port} {host_key}\n")


def test_a_500mb_pull_cut_midway_resumes_with_only_the_rest_in_bounded_memory(remote, testbed):  # noqa: F811
    mb = 500
    total = mb << 20
    _project(remote, mb)
    proxy = testbed.proxy("10.77.0.200", 22)
    _through(remote, testbed, proxy)
    exp_id = _deploy(remote, "--target", "cut")
    args = ["-e", str(exp_id), "--checkpoints"]
    dest = remote.path / "orch-pull" / f"exp{exp_id}" / "checkpoints"

    # the link drops once: the same pull connects again and asks for the rest of the file
    dropped, first_peak = _pull_sampled(remote, proxy, args, cut_at=int(total * 0.4))
    assert dropped.returncode == 0, dropped.stderr
    assert "orch: the link dropped after" in dropped.stderr and "; resuming" in dropped.stderr
    assert json.loads(dropped.stdout)["sent_bytes"] == total  # every byte came once
    assert _sha(dest / "ckpt.pt") == expected_ckpt(mb)

    # cut for good: the pull fails, keeps its part, and the next one sends only the rest
    (dest / "ckpt.pt").unlink()
    cut, second_peak = _pull_sampled(remote, proxy, args, cut_at=int(total * 0.45), for_good=True)
    assert cut.returncode == 3, cut.stdout + cut.stderr
    assert "error: the pull was cut after" in cut.stderr and "run the same orch pull again" in cut.stderr
    kept = (dest / ".ckpt.pt.part").stat().st_size
    assert 0 < kept < total and not (dest / "ckpt.pt").exists()
    proxy = testbed.proxy("10.77.0.200", 22)
    _through(remote, testbed, proxy)
    done, third_peak = _pull_sampled(remote, proxy, args, cut_at=None)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert [(f["action"], f["offset"]) for f in data["files"]] == [("resume", kept)]
    assert data["sent_bytes"] == total - kept  # only the rest came
    assert _sha(dest / "ckpt.pt") == expected_ckpt(mb)
    assert not (dest / ".ckpt.pt.part").exists()
    peak_mb = max(first_peak, second_peak, third_peak) >> 10
    print(f"\npull of {mb} MiB: dropped at 40% and resumed in the same pull; cut for good at {kept >> 20} MiB and "
          f"resumed with {(total - kept) >> 20} MiB; peak RSS of the orch process {peak_mb} MiB")
    assert 0 < peak_mb < 160  # a fraction of the file: it streams in 1 MiB pieces


def test_pull_from_a_jobs_node(remote, testbed):  # noqa: F811
    (remote.path / "train.py").write_text(TRAIN)
    remote.write(entries=False, extra='\n[distributed]\nlauncher = "none"\n')
    toml = remote.path / "orch.toml"
    toml.write_text(toml.read_text().replace('TINYLM_SAMPLES = "600"', 'PULL_MB = "1"'))
    res = remote.run("deploy", "--ct", "200", "--ct", "201", "--json")
    assert res.returncode == 0, res.stderr
    exp_id = remote.registry().list()[0].id
    _finished(remote, ("--ct", "200", "--ct", "201"))
    one = _pulled(remote, "-e", str(exp_id), "--node", "1", "--outputs")
    dest = remote.path / "orch-pull" / f"exp{exp_id}" / "node1"
    assert Path(one["dest"]) == Path("orch-pull") / f"exp{exp_id}" / "node1"
    assert (dest / "outputs" / "out" / "host.txt").read_text() == "ct201\n"
    zero = _pulled(remote, "-e", str(exp_id), "--outputs", "--log")
    assert (remote.path / zero["dest"] / "outputs" / "out" / "host.txt").read_text() == "ct200\n"
    bad = remote.run("pull", "-e", str(exp_id), "--node", "2")
    assert bad.returncode == 2 and "nodes 0 to 1" in bad.stderr, bad.stderr


OWN = """\
import os, signal, sys, time
ckpt, exp = os.environ["ORCH_CHECKPOINT_DIR"], os.environ["ORCH_EXPERIMENT_ID"]
os.makedirs(ckpt, exist_ok=True)
with open(os.path.join(ckpt, "last.ckpt"), "w") as fh:
    fh.write(f"weights of experiment {int(exp):04d}")
signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
while True:
    print("step=1 loss=1.0", flush=True)
    time.sleep(0.2)
"""


def test_restart_and_pull_of_an_experiment_use_its_own_folder_and_files_on_a_ct(remote, testbed,  # noqa: F811
                                                                               tmp_path):
    """Experiment 2, launched with --set paths.checkpoints: restart -e 2 cleans its folder (not the default one
    experiment 1 wrote), and pull -e 2 brings its own last.ckpt from the trash entry, never experiment 3's."""
    from tests.conftest import wait_for
    from tests.integration.test_remote import on_ct

    (remote.path / "train.py").write_text(OWN)
    other = "/workspace/elsewhere/ck"

    def holds(folder: str, exp_id: int) -> bool:
        got = on_ct(testbed, 200, "sh", "-c", f"cat {folder}/last.ckpt 2>/dev/null || true")
        return got == f"weights of experiment {exp_id:04d}"

    try:
        assert remote.run("deploy", "--ct", "200").returncode == 0
        wait_for(lambda: holds(CKPT, 1), what="experiment 1's checkpoint")
        res = remote.run("deploy", "--ct", "200", "--set", f"paths.checkpoints={other}")
        assert res.returncode == 0, res.stderr
        wait_for(lambda: holds(other, 2), what="experiment 2's checkpoint")
        assert remote.run("pull", "-e", "2", "--checkpoints").returncode == 0
        mine = remote.path / "orch-pull" / "exp2" / "checkpoints" / "last.ckpt"
        assert mine.read_text() == "weights of experiment 0002"

        res = remote.run("restart", "-e", "2", "--clean-checkpoints", "--yes", "--json", timeout=180)
        assert res.returncode == 0, res.stderr
        three = json.loads(res.stdout)["experiment"]
        assert three["checkpoints"] == other and three["checkpoints_entry"].startswith(other + ".trash/")
        wait_for(lambda: holds(other, 3), what="experiment 3's checkpoint")
        assert holds(CKPT, 1)  # experiment 1's folder was never touched

        res = remote.run("pull", "-e", "2", "--checkpoints", timeout=180)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "skipped checkpoints/last.ckpt: written by experiment 3" in res.stderr and "--force" not in res.stderr
        assert mine.read_text() == "weights of experiment 0002"
        res = remote.run("pull", "-e", "2", "--checkpoints", "--to", str(tmp_path / "two"), timeout=180)
        assert res.returncode == 0, res.stderr
        assert (tmp_path / "two" / "checkpoints" / "last.ckpt").read_text() == "weights of experiment 0002"
    finally:
        remote.run("stop", "--ct", "200", "--all")
