"""The pure parts of a Slurm target: sbatch's arguments, job.sh, Slurm's refusals, its GPU counts, run states."""

from __future__ import annotations

import shlex

import pytest

from orchestrator.agent.run import slurm


def test_sbatch_gets_the_targets_options_the_runs_gpus_and_appends_to_its_output() -> None:
    argv = slurm.sbatch_argv("/shared/orch/runs/k-3", {"name": "orch-p-3", "partition": "gpu", "account": "ml",
                                                       "time": "1:00:00", "gpus": 2, "nodes": 2,
                                                       "sbatch_args": ["--mem=8G"]})
    assert argv[:2] == ["sbatch", "--parsable"] and argv[-1] == "/shared/orch/runs/k-3/job.sh"
    assert {"--nodes=2", "--ntasks-per-node=1", "--open-mode=append", "--partition=gpu", "--account=ml",
            "--time=1:00:00", "--gres=gpu:2", "--mem=8G", "--output=/shared/orch/runs/k-3/slurm-%j.out"} <= set(argv)
    assert "--qos" not in " ".join(argv)
    assert slurm.sbatch_argv("/r", {}, test_only=True)[1] == "--test-only"


def test_job_sh_starts_the_supervisor_under_srun_quoted_once() -> None:
    text = slurm.script("/usr/bin/python3", "/shared/my orch/agent/agent-1.pyz", "/shared/my orch/runs/k-1")
    line = text.splitlines()[-1]
    assert text.startswith("#!/bin/sh\n") and line.startswith("exec srun ")
    assert shlex.split(line)[-3:] == ["/shared/my orch/agent/agent-1.pyz", "supervise", "/shared/my orch/runs/k-1"]


@pytest.mark.parametrize(("said", "hint"), [
    ("sbatch: error: invalid partition specified: nope\nsbatch: error: Batch job submission failed: Invalid "
     "partition name specified", "sinfo"),
    ("sbatch: error: Batch job submission failed: Requested node configuration is not available", "fewer GPUs"),
    ("sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified",
     "sacctmgr"),
    ("sbatch: unrecognized option '--bogus'", "sbatch_args"),
])
def test_a_refusal_keeps_slurms_words_and_says_what_to_change(said: str, hint: str) -> None:
    words, told = slurm.refusal(said)
    assert "\n" not in words and said.splitlines()[-1].strip() in words
    assert hint in told


def test_gpus_are_counted_from_gres_and_tres() -> None:
    assert slurm._gpu_count("gpu:2") == 2
    assert slurm._gpu_count("gpu:a100:4(S:0-1)") == 4
    assert slurm._gpu_count("gpu:1(IDX:0)") == 1
    assert slurm._gpu_count("cpu=1,gres/gpu=3") == 3
    assert slurm._gpu_count("(null)") == 0


def test_a_runs_state_from_its_job() -> None:
    job = {"job_id": "7", "partition": "gpu", "submitted": 100.0}
    row = dict(zip(slurm.FIELDS, ["7", "PENDING", "Resources", "", "", "N/A", "gpu", "4294"]))
    pending = slurm.state(job, {}, False, {"7": row})
    assert pending["state"] == "queued" and pending["slurm"]["reason"] == "Resources"
    running = slurm.state(job, {}, False, {"7": row | {"state": "RUNNING", "nodes": "n[1-2]"}})
    assert running["state"] == "running" and running["slurm"]["nodes"] == "n[1-2]"
    assert slurm.state(job, {}, True, {})["state"] == "stopped"
    gone = slurm.state(job, {"child": 5}, False, {})
    assert gone["state"] == "crashed" and "without the supervisor's exit record" in gone["cause"]


def test_a_pending_job_says_since_when_it_waits_from_slurms_submit_time() -> None:
    import time

    from orchestrator.launch.slurm import state_words

    job = {"job_id": "7", "partition": "gpu", "submitted": 100.0}
    row = dict(zip(slurm.FIELDS, ["7", "PENDING", "Resources", "", "2026-12-07T12:03:14", "N/A", "gpu", "4294"]))
    told = slurm.state(job, {}, False, {"7": row})["slurm"]
    assert told["since"] == time.mktime((2026, 12, 7, 12, 3, 14, 0, 0, -1))
    assert state_words("queued", told, now=told["since"] + 125) == "pending (Resources) since 12:03:14, 2 min"
    unknown = slurm.state(job, {}, False, {"7": row | {"submitted": "N/A"}})["slurm"]
    assert unknown["since"] == 100.0  # Slurm did not say: the time orch submitted it
    assert state_words("queued", unknown, now=100.0 + 3 * 86400).startswith("pending (Resources) since 1970-01-")


def test_the_allocation_is_kept_over_the_launchs_variables() -> None:
    kept = slurm.allocation({"SLURM_JOB_ID": "4", "SLURMD_NODENAME": "n1", "CUDA_VISIBLE_DEVICES": "1",
                             "HOME": "/root"})
    assert kept == {"SLURM_JOB_ID": "4", "SLURMD_NODENAME": "n1", "CUDA_VISIBLE_DEVICES": "1"}
    assert slurm.node_env({"SLURM_NNODES": "1"}) == {}


def test_a_python_job_over_nodes_gets_torchruns_lines_with_a_place_for_each_nodes_address() -> None:
    from orchestrator.agent.run import slurm_launch
    from orchestrator.config import Settings
    from orchestrator.launch.slurm import launcher

    settings = Settings(project={"name": "p"}, run={"restarts": 2})
    plan = launcher(settings, ["python3", "-u", "train.py", "--lr", "1"], 7, {"nodes": 2, "gpus": 2})["torchrun"]
    assert plan["places"] == ["{orch:node0}", "{orch:node1}"] and plan["python"] == "python3"
    assert plan["env"] == {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}  # the allocation gives the ORCH_* ones
    second = slurm_launch.fill(plan["argv"][1], plan["places"], ["10.0.0.1", "10.0.0.2"])
    assert second == ["python3", "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=2",
                      "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.1:29400", "--rdzv-id=p-exp7",
                      "--rdzv-conf=is_host=0", "--local-addr=10.0.0.2", "--max-restarts=2", "train.py", "--lr", "1"]
    # one node, a command that is no Python script, launcher = "none": the command as it is
    assert launcher(settings, ["python3", "train.py"], 7, {"nodes": 1}) == {}
    assert launcher(settings, "./train.sh", 7, {"nodes": 2}) == {}
    assert launcher(settings, "python3 train.py | tee out", 7, {"nodes": 2}) == {}
    none = Settings(project={"name": "p"}, distributed={"launcher": "none"})
    assert launcher(none, ["python3", "train.py"], 7, {"nodes": 2}) == {}


def test_a_batch_jobs_secrets_wait_in_a_file_per_node_every_attempt_reads_until_the_run_has_ended(
        tmp_path, monkeypatch) -> None:
    import stat
    import time

    from orchestrator.agent.run import handover

    handover.leave(str(tmp_path), {"TOKEN": "v"}, 2)
    assert stat.S_IMODE((tmp_path / "secrets").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "secrets" / "1.json").stat().st_mode) == 0o600
    assert handover.take(str(tmp_path), {"SLURM_NODEID": "1"}) == {"TOKEN": "v"}
    assert handover.take(str(tmp_path), {"SLURM_NODEID": "1"}) == {"TOKEN": "v"}  # a requeued attempt's
    job, ended = {"job_id": "7"}, {"ended": time.time(), "exit_code": 0}
    monkeypatch.setattr(slurm, "queue", lambda ids: {"7": {"state": "COMPLETING"}})
    slurm.settled(str(tmp_path), job, ended)  # still in Slurm's queue: it may run again
    assert len(list((tmp_path / "secrets").iterdir())) == 2
    monkeypatch.setattr(slurm, "queue", lambda ids: {})
    slurm.settled(str(tmp_path), job, ended)  # gone from the queue: ended for good
    assert list((tmp_path / "secrets").iterdir()) == []
    asked = []
    monkeypatch.setattr(slurm, "queue", lambda ids: asked.append(ids) or {})
    slurm.settled(str(tmp_path), job, ended)
    assert asked == []  # nothing left: Slurm is not asked
    handover.leave(str(tmp_path), {"TOKEN": "v"}, 1)
    handover.drop(str(tmp_path))  # a stop
    assert list((tmp_path / "secrets").iterdir()) == []


@pytest.mark.parametrize("order", ["cause first", "summary first"])
def test_why_a_job_failed_is_the_line_that_says_why_whichever_process_flushed_first(tmp_path, order):
    cause = "slurmstepd-ct211: error: execve(): python3: No such file or directory"
    summary = "srun: error: ct211: task 0: Exited with exit code 2"
    lines = [cause, summary] if order == "cause first" else [summary, cause]
    out = tmp_path / "slurm-7.out"
    out.write_text("\n".join(["starting", *lines]) + "\n")
    assert slurm._last_words(str(out)) == f"{cause}; {summary}"
    out.write_text("Traceback (most recent call last):\nModuleNotFoundError: No module named 'zipimport'\n")
    assert slurm._last_words(str(out)) == "ModuleNotFoundError: No module named 'zipimport'"
    out.write_text("")
    assert slurm._last_words(str(out)) is None
