"""A ``kind = "slurm"`` target end to end: the real CLI against a real two-node Slurm cluster in LXC containers.

The login node (CT 210) is reached over SSH with strict host keys; orch's root is on ``/shared``, a folder both
nodes mount, as a cluster's shared file system. The run is a small script that prints what its allocation gave it
(``SLURM_JOB_ID``, ``CUDA_VISIBLE_DEVICES``, ``ORCH_RESUME_FROM``), writes a checkpoint every 5 steps and one more
on SIGINT, so a graceful stop shows as a final checkpoint.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import Project
from tests.waits import wait_for

pytestmark = pytest.mark.testbed

ROOT = "/shared/orch"

TRAIN = """\
import os, pathlib, signal, sys, time
ck = pathlib.Path(os.environ["ORCH_CHECKPOINT_DIR"])
ck.mkdir(parents=True, exist_ok=True)
print("job", os.environ.get("SLURM_JOB_ID", "-"), "node", os.environ.get("SLURMD_NODENAME", "-"),
      "cuda", os.environ.get("CUDA_VISIBLE_DEVICES", "-"), "resume", os.environ.get("ORCH_RESUME_FROM") or "-",
      "restarts", os.environ.get("SLURM_RESTART_COUNT", "-"), "rank", os.environ.get("ORCH_NODE_RANK", "-"),
      "of", os.environ.get("ORCH_NNODES", "-"), "master", os.environ.get("ORCH_MASTER_ADDR", "-"), flush=True)
stop = []
signal.signal(signal.SIGINT, lambda *_: stop.append(1))
resume = os.environ.get("ORCH_RESUME_FROM")
first = int(pathlib.Path(resume).stem.split("-")[1]) if resume else 0
steps, pause = int(os.environ.get("STEPS", "5")), float(os.environ.get("PAUSE", "0.2"))
if os.environ.get("SLURM_RESTART_COUNT", "0") != "0":  # a requeued attempt: RESUMED_PAUSE between its steps
    pause = float(os.environ.get("RESUMED_PAUSE", pause))
for step in range(first + 1, steps + 1):
    time.sleep(pause)
    print(f"step={step} loss={1.0 / step:.4f}", flush=True)
    if stop:
        (ck / f"ckpt-{step}.pt").write_text(str(step))
        print(f"final checkpoint at step {step}", flush=True)
        sys.exit(0)
    if step % 5 == 0:
        (ck / f"ckpt-{step}.pt").write_text(str(step))
print("done", flush=True)
"""


class SlurmProject(Project):
    def __init__(self, path: Path, cluster) -> None:
        super().__init__(path, Path(cluster.shared) / "orch")
        self.cluster = cluster

    def write(self, *, steps: int = 5, pause: float = 0.2, target: str = "", name: str = "slurmy",
              resumed_pause: float | None = None) -> None:
        login = self.cluster.login
        resumed = "" if resumed_pause is None else f', RESUMED_PAUSE = "{resumed_pause}"'
        (self.path / "train.py").write_text(TRAIN)
        (self.path / "orch.toml").write_text(f"""\
default_target = "lab"

[project]
name = "{name}"
sources = ["train.py"]
command = "python3 train.py"
env = {{ STEPS = "{steps}", PAUSE = "{pause}"{resumed} }}

[run]
stop_timeout = 15
term_timeout = 3
checkpoint_glob = "ckpt-*.pt"

[ssh]
known_hosts = ["{self.cluster.known_hosts_path}"]
identity_file = "{self.cluster.key_path}"
trust_file = "{self.path / 'trusted_hosts'}"

[targets.lab]
kind = "slurm"
host = "{login.address}"
user = "root"
root = "{ROOT}"
{target}
""")

    def json(self, *args: str) -> dict:
        done = self.run(*args, "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout)

    def until(self, wanted, what: str, timeout: float = 90) -> dict:
        """``orch status --json`` until ``wanted(it)``."""
        seen: list = [{}]

        def check() -> dict | None:
            seen[0] = self.json("status")
            return seen[0] if wanted(seen[0]) else None

        return wait_for(check, timeout=timeout, what=what, every=1, describe=lambda: f"last status: {seen[0]}")


@pytest.fixture
def lab(tmp_path: Path, slurm_cluster) -> SlurmProject:
    slurm_cluster.cancel_all()
    # the shared file system lives for the session: another test's checkpoints must not be this one's to resume
    shutil.rmtree(Path(slurm_cluster.shared) / "orch" / "checkpoints", ignore_errors=True)
    path = tmp_path / "proj"
    path.mkdir()
    proj = SlurmProject(path, slurm_cluster)
    proj.write()
    return proj


def _job_of(proj: SlurmProject, exp_id: int) -> str:
    with proj.registry() as reg:
        return reg.get(exp_id).target_info["slurm"]["job_id"]


def test_a_run_goes_through_slurm_to_its_end(lab: SlurmProject) -> None:
    done = lab.run("deploy", "-m", "first")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Slurm job" in done.stdout and "lab (Slurm at 10.77.0.210)" in done.stdout, done.stdout
    job = _job_of(lab, 1)
    followed = lab.run("logs", "--follow", timeout=90)  # from pending on, to the run's end
    assert followed.returncode == 0 and "step=5" in followed.stdout and "done" in followed.stdout, \
        followed.stdout + followed.stderr
    end = lab.until(lambda s: s["state"] == "finished", "finished")
    assert end["exit_code"] == 0 and end["slurm"]["job_id"] == job
    log = lab.run("logs", "-e", "1", "-n", "1000")
    assert log.returncode == 0, log.stderr
    # the run's own supervisor ran it in the allocation: Slurm's variables and orch's together
    assert f"job {job} node ct21" in log.stdout and "step=5" in log.stdout and "done" in log.stdout, log.stdout
    shown = lab.run("status")
    assert "experiment 1 finished" in shown.stdout and f"Slurm job {job}" in shown.stdout, shown.stdout
    # the checkpoints default to the shared file system, under the target's root
    assert (lab.root / "checkpoints" / "slurmy" / "ckpt-5.pt").exists()
    with lab.registry() as reg:
        assert reg.get(1).checkpoints == f"{ROOT}/checkpoints/slurmy"


def test_pending_while_the_nodes_are_full_then_running(lab: SlurmProject) -> None:
    cluster = lab.cluster
    blocker = cluster.run("sbatch", "--parsable", "-N2", "--exclusive", "--wrap", "sleep 300").stdout.decode().strip()
    lab.write(steps=200, pause=0.1)
    done = lab.run("deploy")
    assert done.returncode == 0, done.stdout + done.stderr
    pending = lab.until(lambda s: s["state"] == "queued" and s["slurm"].get("reason") in ("Resources", "Priority"),
                        "pending")
    shown = lab.run("status")
    # Slurm may move its reason between the two looks (Priority, then Resources once the job is next)
    assert any(f"experiment 1 pending ({why}) since " in shown.stdout for why in ("Resources", "Priority")), \
        (pending["slurm"], shown.stdout)
    # --queue: Slurm is the queue, so the second job is submitted beside the first, which goes on pending
    queued = lab.run("deploy", "--queue")
    assert queued.returncode == 0 and "experiment 2: pending" in queued.stdout, queued.stdout + queued.stderr
    listed = lab.json("queue", "--target", "lab")["queue"]
    assert [e["id"] for e in listed] == [1, 2] and all(e["reason"] and e["priority"] for e in listed), listed
    assert "pending on lab" in lab.run("queue").stdout
    cluster.run("scancel", blocker)
    running = lab.until(lambda s: s["state"] == "running", "running", timeout=60)
    assert running["slurm"]["nodes"].startswith("ct21")
    assert "running on ct21" in lab.run("status").stdout
    stopped = lab.run("stop")
    assert stopped.returncode == 0 and "stopped" in stopped.stdout, stopped.stdout + stopped.stderr


def test_stop_sends_sigint_and_the_run_writes_its_final_checkpoint(lab: SlurmProject) -> None:
    lab.write(steps=1000, pause=0.1)
    assert lab.run("deploy").returncode == 0
    lab.until(lambda s: s["state"] == "running" and "step=" in (s.get("last_line") or ""), "running")
    stopped = lab.run("stop")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "experiment 1" in stopped.stdout and "stopped" in stopped.stdout and "SIGINT" in stopped.stdout
    log = lab.run("logs", "-e", "1", "-n", "1000").stdout
    assert "final checkpoint at step" in log, log
    job = _job_of(lab, 1)
    assert not lab.cluster.run("squeue", "-h", "-j", job, check=False).stdout.strip()  # nothing left running
    assert lab.json("status")["state"] == "stopped"


def test_a_pending_job_is_cancelled_by_stop(lab: SlurmProject) -> None:
    cluster = lab.cluster
    blocker = cluster.run("sbatch", "--parsable", "-N2", "--exclusive", "--wrap", "sleep 300").stdout.decode().strip()
    try:
        assert lab.run("deploy").returncode == 0
        lab.until(lambda s: s["state"] == "queued", "pending")
        stopped = lab.run("stop")
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert lab.json("status")["state"] == "stopped"
        assert not cluster.run("squeue", "-h", "-j", _job_of(lab, 1), check=False).stdout.strip()
    finally:
        cluster.run("scancel", blocker, check=False)


def test_gpus_1_gives_the_run_one_device(lab: SlurmProject) -> None:
    done = lab.run("deploy", "--gpus", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    lab.until(lambda s: s["state"] == "finished", "finished")
    log = lab.run("logs", "-e", "1", "-n", "1000").stdout
    assert " cuda 0 " in log or " cuda 1 " in log, log


@pytest.mark.parametrize(("flags", "target", "words"), [
    ((), 'partition = "nope"', "invalid partition"),
    (("--gpus", "3"), "", "node configuration is not available"),
    ((), 'sbatch_args = ["--bogus-flag"]', "unrecognized option"),
])
def test_a_job_slurm_refuses_is_an_error_and_nothing_runs(lab: SlurmProject, flags, target, words) -> None:
    lab.write(target=target)
    done = lab.run("deploy", *flags)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "error:" in done.stderr and words in done.stderr.lower() and "hint:" in done.stderr, done.stderr
    with lab.registry() as reg:
        assert all(e.status not in ("running", "queued", "launching") for e in reg.list())
    assert not lab.cluster.run("squeue", "-h", check=False).stdout.strip()


def _step(status: dict) -> int:
    """The step the run's log last printed (``step=N``), 0 before the first; "step=1" in a line is also step 10."""
    import re

    found = re.search(r"\bstep=(\d+)", status.get("last_line") or "")
    return int(found[1]) if found else 0


def test_a_requeued_job_is_the_same_experiment_resuming_from_its_checkpoint(lab: SlurmProject) -> None:
    lab.write(steps=60, pause=0.2)
    toml = lab.path / "orch.toml"  # with a secret, which the requeued attempt reads again
    toml.write_text(toml.read_text().replace('sources = ["train.py"]', 'sources = ["train.py"]\nsecrets = ["LAB_TOKEN"]'))
    assert lab.run("deploy", env={"LAB_TOKEN": "requeue-me"}).returncode == 0
    lab.until(lambda s: s["state"] == "running" and _step(s) > 10, "past step 10")
    assert (lab.root / "checkpoints" / "slurmy" / "ckpt-10.pt").exists()
    job = _job_of(lab, 1)
    lab.cluster.run("scontrol", "requeue", job)
    back = lab.until(lambda s: s["state"] == "running" and s["experiment"] == 1 and (s.get("attempt") or 0) >= 2,
                     "running again", timeout=150)
    assert back["slurm"]["job_id"] == job
    end = lab.until(lambda s: s["state"] == "finished", "finished", timeout=120)
    assert end["experiment"] == 1 and end["exit_code"] == 0
    log = lab.run("logs", "-e", "1", "-n", "1000").stdout
    assert "restarts 1" in log and f"resume {ROOT}/checkpoints/slurmy/ckpt-" in log, log
    with lab.registry() as reg:
        assert [e.id for e in reg.list()] == [1]
    # ended for good: the first status that finds its job gone from Slurm's queue removes the secrets' files
    wait_for(lambda: lab.run("status").returncode == 0 and not list((lab.run_dir(1) / "secrets").iterdir()),
             what="the secrets' files removed")


def test_a_login_node_without_slurm_is_an_error(lab: SlurmProject) -> None:
    cluster = lab.cluster
    cluster.run("mv", "/usr/bin/sbatch", "/usr/bin/sbatch.away")
    try:
        done = lab.run("deploy")
    finally:
        cluster.run("mv", "/usr/bin/sbatch.away", "/usr/bin/sbatch")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "error: sbatch is not on the login node's PATH" in done.stderr and "hint:" in done.stderr, done.stderr
    with lab.registry() as reg:
        assert all(e.status not in ("running", "queued", "launching") for e in reg.list())


def test_restart_with_clean_checkpoints_moves_them_aside_and_submits_anew(lab: SlurmProject) -> None:
    lab.write(steps=1000, pause=0.1)
    assert lab.run("deploy").returncode == 0
    lab.until(lambda s: s["state"] == "running" and _step(s) > 10, "past step 10")
    done = lab.run("restart", "--clean-checkpoints", "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "moved to" in done.stderr and "experiment 2" in done.stdout and "Slurm job" in done.stdout, done.stdout
    first, second = _job_of(lab, 1), _job_of(lab, 2)
    assert first != second
    with lab.registry() as reg:
        assert reg.get(1).status == "stopped"
    lab.until(lambda s: s["experiment"] == 2 and s["state"] == "running" and "step=" in (s.get("last_line") or ""),
              "the new run going")
    log = lab.run("logs", "-e", "2", "-n", "1000").stdout
    assert "resume -" in log, log  # its checkpoints were moved aside: it starts afresh
    listed = lab.run("checkpoints", "list")
    assert listed.returncode == 0 and "trash" in listed.stdout, listed.stdout + listed.stderr
    assert lab.run("stop").returncode == 0


def test_gpus_lists_each_node_with_its_gres_and_the_jobs_holding_them(lab: SlurmProject) -> None:
    lab.write(steps=1000, pause=0.1)
    assert lab.run("deploy", "--gpus", "1").returncode == 0
    running = lab.until(lambda s: s["state"] == "running", "running")
    shown = lab.json("gpus", "--target", "lab")["nodes"]
    by = {n["node"]: n for n in shown}
    assert sorted(by) == ["ct210", "ct211"] and all(n["gpus"] == 2 for n in shown), shown
    held = by[running["slurm"]["nodes"]]
    assert held["gpus_used"] == 1 and held["jobs"][0]["name"] == "orch-slurmy-1", shown
    table = lab.run("gpus")
    assert table.returncode == 0 and "orch-slurmy-1" in table.stdout, table.stdout + table.stderr
    assert lab.run("stop").returncode == 0


def test_a_job_over_two_nodes_runs_a_supervisor_on_each(lab: SlurmProject) -> None:
    done = lab.run("deploy", "--nodes", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    # followed from pending to the end: both nodes' lines, each prefixed with its rank as for a job over CTs
    followed = lab.run("logs", "--follow", timeout=120)
    assert followed.returncode == 0, followed.stdout + followed.stderr
    for rank in (0, 1):
        assert f"[{rank}] done" in followed.stdout and f"rank {rank} of 2 master ct210" in followed.stdout, \
            followed.stdout + followed.stderr
    end = lab.until(lambda s: s["state"] == "finished", "finished")
    assert end["exit_code"] == 0
    merged = lab.run("logs", "-e", "1", "-n", "1000").stdout
    assert "[0] job" in merged and "[1] job" in merged and "[1] step=5" in merged, merged
    second = lab.run("logs", "--node", "1", "-n", "1000").stdout  # one node's log alone, unprefixed
    assert "node ct211" in second and "rank 1 of 2 master ct210" in second and "rank 0" not in second, second
    assert "[1]" not in second, second
    assert (lab.run_dir(1) / "nodes" / "1" / "train.log").exists()


def test_a_requeued_job_over_two_nodes_runs_again_on_both(lab: SlurmProject) -> None:
    # slow until the requeue (which must come before the first attempt ends), quick once it runs again
    lab.write(steps=100, pause=0.2, resumed_pause=0.02)
    assert lab.run("deploy", "--nodes", "2").returncode == 0
    lab.until(lambda s: s["state"] == "running" and _step(s) > 10, "past step 10")
    lab.cluster.run("scontrol", "requeue", _job_of(lab, 1))
    end = lab.until(lambda s: s["state"] == "finished" and (s.get("attempt") or 0) >= 2, "finished again",
                    timeout=180)
    assert end["exit_code"] == 0
    merged = lab.run("logs", "-e", "1", "-n", "1000").stdout
    # the second node's supervisor set its first attempt's exit record aside and ran again, as the first node's did
    assert "restarts 1 rank 0 of 2" in merged and "[1] job" in merged and "restarts 1 rank 1 of 2" in merged, merged


def test_doctor_checks_the_controller_partition_and_a_compute_node(lab: SlurmProject) -> None:
    report = lab.run("doctor", "--json")
    found = {f["check"]: f for f in json.loads(report.stdout)["findings"]}
    assert found["slurmctld"]["status"] == "ok" and found["partition"]["status"] == "ok", found
    assert found["compute node python"]["status"] == "ok" and found["shared root"]["status"] == "ok", found
    # task/none here: no confinement, said as a warning, never a failure
    assert found["gpu confinement"]["status"] == "warn" and report.returncode == 0, found
    lab.write(target='partition = "nope"')
    bad = lab.run("doctor")
    assert bad.returncode == 6 and "FAIL  partition" in bad.stdout and "nope" in bad.stdout, bad.stdout


def test_a_compute_node_without_python_ends_the_run_crashed_with_slurms_words(lab: SlurmProject) -> None:
    second = lab.cluster.nodes[1]
    second.attach("mv", "/usr/bin/python3.11", "/usr/bin/python3.11.away")
    try:
        lab.write(target='sbatch_args = ["--nodelist=ct211"]')
        assert lab.run("deploy").returncode == 0
        end = lab.until(lambda s: s["state"] == "crashed", "crashed")
    finally:
        second.attach("mv", "/usr/bin/python3.11.away", "/usr/bin/python3.11")
    assert "without the supervisor's exit record" in (end["end_reason"] or ""), end
    assert "python3" in end["end_reason"], end


def test_at_its_time_limit_a_run_checkpoints_and_goes_on_in_a_new_allocation(lab: SlurmProject) -> None:
    # the signal and the resubmit from the [slurm] table, the time limit the target's own
    lab.write(steps=5000, pause=0.2, target='time = "1"\n\n[slurm]\nsignal = "INT@45"\nresubmit = true\ntime = "10"')
    assert lab.run("deploy").returncode == 0
    job = _job_of(lab, 1)
    back = lab.until(lambda s: s["state"] == "running" and (s.get("attempt") or 0) >= 2, "in its second allocation",
                     timeout=200)
    assert back["experiment"] == 1 and back["slurm"]["job_id"] == job
    log = lab.run("logs", "-e", "1", "-n", "5000").stdout
    assert "final checkpoint at step" in log and "requeued, to go on in a new allocation" in log, log
    assert "restarts 1" in log and f"resume {ROOT}/checkpoints/slurmy/ckpt-" in log, log
    assert lab.run("stop").returncode == 0
    assert lab.json("status")["state"] == "stopped"


def test_status_says_how_slurms_accounting_saw_the_end_where_it_is_on(lab: SlurmProject) -> None:
    # accounting off (this cluster's default): the supervisor's own record, and nothing more said
    assert lab.run("deploy").returncode == 0
    end = lab.until(lambda s: s["state"] == "finished", "finished")
    assert "sacct" not in end["slurm"], end["slurm"]
    assert "sacct" not in lab.run("status").stdout
    assert json.loads((lab.run_dir(1) / "sacct.json").read_text())["off"] is True  # not asked again
    # a job completion log (jobcomp/filetxt) is on: sacct -c answers, and status says how Slurm saw the end
    with lab.cluster.job_completion_log():
        lab.write(target='time = "5"')
        assert lab.run("deploy").returncode == 0
        job = _job_of(lab, 2)
        told = lab.until(lambda s: s["experiment"] == 2 and (s.get("slurm") or {}).get("sacct"), "sacct's word")
        assert told["state"] == "finished" and told["slurm"]["job_id"] == job
        assert told["slurm"]["sacct"]["state"] == "COMPLETED" and told["slurm"]["sacct"]["exit_code"] == "0:0"
        shown = lab.run("status").stdout
        assert f"Slurm job {job}; sacct: COMPLETED, exit code 0:0, ran 00:" in shown, shown
        # asked once: the next status reads it from the run folder
        assert json.loads((lab.run_dir(2) / "sacct.json").read_text())["state"] == "COMPLETED"


DDP = """\
import os, signal, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([rank + 1.0])
dist.all_reduce(total)
print(f"worker {rank} of {world} sum {total.item():g} node {os.environ['ORCH_NODE_RANK']} of "
      f"{os.environ['ORCH_NNODES']} master {os.environ['ORCH_MASTER_ADDR']} torchrun {os.environ['MASTER_ADDR']} "
      f"job {os.environ['SLURM_JOB_ID']}", flush=True)
stop = []
signal.signal(signal.SIGINT, lambda *_: stop.append(1))
for step in range(1, int(os.environ.get("DDP_STEPS", "0")) + 1):
    time.sleep(0.2)
    print(f"worker {rank} step={step}", flush=True)
    if stop:
        print(f"worker {rank} final checkpoint at step {step}", flush=True)
        break
dist.destroy_process_group()
"""


@pytest.fixture
def torch_nodes(lab: SlurmProject):
    """torch importable on both compute nodes (the testbed's torch site, read-only), for this test alone."""
    from tests.testbed import torchsite

    site = torchsite.ensure_site()
    try:
        for ct in lab.cluster.nodes:
            torchsite.mount(ct, site)
        # the controller restarted from its saved state, which may still hold an earlier test's job as running
        lab.cluster.cancel_all()
        yield site
    finally:
        for ct in lab.cluster.nodes:
            ct.attach("rm", "-f", "/" + torchsite.PTH, check=False)  # the mount itself goes at the CT's next start
            torchsite.unmount(ct, site)


def test_a_python_job_over_two_nodes_starts_with_torchrun_and_c10d_on_the_first(lab: SlurmProject,
                                                                                 torch_nodes) -> None:
    (lab.path / "ddp.py").write_text(DDP)
    lab.write()
    toml = lab.path / "orch.toml"
    toml.write_text(toml.read_text().replace('sources = ["train.py"]', 'sources = ["train.py", "ddp.py"]')
                    .replace('command = "python3 train.py"', 'command = "OMP_NUM_THREADS=1 python3 ddp.py"'))
    done = lab.run("deploy", "--nodes", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    end = lab.until(lambda s: s["state"] in ("finished", "crashed"), "the end", timeout=240)
    merged = lab.run("logs", "-e", "1", "-n", "1000").stdout
    assert end["state"] == "finished", merged
    job = _job_of(lab, 1)
    # one rendezvous over both nodes: the workers' ranks and world come from torchrun, the ORCH_* as on CTs
    assert "[0] orch: torchrun over 2 nodes, rendezvous (c10d) at 10.77.0.210:29400" in merged, merged
    for rank in (0, 1):
        assert f"[{rank}] worker {rank} of 2 sum 3 node {rank} of 2 master ct210 torchrun 10.77.0.210 job {job}" \
            in merged, merged
    # a stop: SIGINT through each node's supervisor and torchrun to its worker, which writes its final checkpoint
    done = lab.run("deploy", "--nodes", "2", "--set", "project.env={DDP_STEPS = '100000'}")
    assert done.returncode == 0, done.stdout + done.stderr
    lab.until(lambda s: s["state"] == "running" and "step=" in (s.get("last_line") or ""), "training", timeout=180)
    stopped = lab.run("stop")
    assert stopped.returncode == 0 and "stopped" in stopped.stdout, stopped.stdout + stopped.stderr
    merged = lab.run("logs", "-e", "2", "-n", "1000").stdout
    assert "[0] worker 0 final checkpoint at step" in merged and "[1] worker 1 final checkpoint at step" in merged, \
        merged


def test_without_torch_a_job_over_two_nodes_runs_its_command_as_it_is(lab: SlurmProject) -> None:
    assert lab.run("deploy", "--nodes", "2").returncode == 0
    lab.until(lambda s: s["state"] == "finished", "finished", timeout=120)
    merged = lab.run("logs", "-e", "1", "-n", "1000").stdout
    assert "[0] orch: python3 cannot import torch on this node: the command runs as it is" in merged, merged
    assert "[1] done" in merged and "rank 1 of 2 master ct210" in merged, merged


SECRET = """\
import hashlib, os
print("token", hashlib.sha256(os.environ["LAB_TOKEN"].encode()).hexdigest()[:12], "rank",
      os.environ.get("ORCH_NODE_RANK", "-"), flush=True)
"""


def test_secrets_reach_every_node_of_a_job_in_a_file_its_supervisor_takes(lab: SlurmProject) -> None:
    import hashlib
    import stat

    value = "s3cret-" + "x" * 20
    (lab.path / "secret.py").write_text(SECRET)
    toml = lab.path / "orch.toml"
    toml.write_text(toml.read_text().replace('sources = ["train.py"]', 'sources = ["secret.py"]\nsecrets = ["LAB_TOKEN"]')
                    .replace('command = "python3 train.py"', 'command = "python3 secret.py"'))
    cluster = lab.cluster
    blocker = cluster.run("sbatch", "--parsable", "-N2", "--exclusive", "--wrap", "sleep 300").stdout.decode().strip()
    try:
        done = lab.run("deploy", "--nodes", "2", env={"LAB_TOKEN": value})
        assert done.returncode == 0, done.stdout + done.stderr
        lab.until(lambda s: s["state"] == "queued", "pending")
        # while the job waits: one file per node, 0600 in a 0700 folder, and the value nowhere else
        run_dir = lab.run_dir(1)
        folder = run_dir / "secrets"
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        files = sorted(folder.iterdir())
        assert [f.name for f in files] == ["0.json", "1.json"], files
        assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 and value in f.read_text() for f in files)
        for name in ("job.sh", "slurm.json", "launch.json", "launch-env.json", "experiment.json"):
            assert value not in (run_dir / name).read_text(), name
    finally:
        cluster.run("scancel", blocker, check=False)
    lab.until(lambda s: s["state"] == "finished", "finished", timeout=120)
    merged = lab.run("logs", "-e", "1", "-n", "1000").stdout
    digest = hashlib.sha256(value.encode()).hexdigest()[:12]
    assert f"[0] token {digest} rank 0" in merged and f"[1] token {digest} rank 1" in merged, merged
    wait_for(lambda: lab.run("status").returncode == 0 and not list(folder.iterdir()),
             what="the secrets' files removed once the job is gone from Slurm's queue")
    assert value not in (lab.path / ".orch" / "experiments.db").read_bytes().decode("latin-1")


def test_a_pending_job_stopped_leaves_no_secrets_behind(lab: SlurmProject) -> None:
    toml = lab.path / "orch.toml"
    toml.write_text(toml.read_text().replace('sources = ["train.py"]', 'sources = ["train.py"]\nsecrets = ["LAB_TOKEN"]'))
    cluster = lab.cluster
    blocker = cluster.run("sbatch", "--parsable", "-N2", "--exclusive", "--wrap", "sleep 300").stdout.decode().strip()
    try:
        assert lab.run("deploy", env={"LAB_TOKEN": "never-used"}).returncode == 0
        lab.until(lambda s: s["state"] == "queued", "pending")
        assert [f.name for f in (lab.run_dir(1) / "secrets").iterdir()] == ["0.json"]
        assert lab.run("stop").returncode == 0
        assert list((lab.run_dir(1) / "secrets").iterdir()) == []
    finally:
        cluster.run("scancel", blocker, check=False)


def test_a_crash_on_slurm_reaches_the_webhook(lab: SlurmProject) -> None:
    from tests.webhook import Webhook

    with Webhook("10.77.0.1") as hook:  # the host's address on the testbed's bridge
        toml = lab.path / "orch.toml"
        toml.write_text(toml.read_text().replace('command = "python3 train.py"',
                                                 'command = "python3 -c \'raise SystemExit(3)\'"')
                        + f'\n[notify]\nurl_secret = "LAB_HOOK"\nformat = "json"\non = ["crashed"]\n')
        assert lab.run("deploy", env={"LAB_HOOK": hook.url}).returncode == 0
        got = hook.wait(1, timeout=90)[0].json()
    assert got["event"] == "crashed" and got["details"]["exit_code"] == 3, got
    wait_for(lambda: lab.run("status").returncode == 0 and not list((lab.run_dir(1) / "secrets").iterdir()),
             what="the webhook's secrets file removed once the job is gone from Slurm's queue")
