"""A run as a Slurm job: submitted from the login node, its state from ``squeue``, stopped with ``scancel``.

On a ``kind = "slurm"`` target the agent runs on the login node, and orch's root (revisions, run folders,
checkpoints) is on the cluster's shared file system. A run's folder is written as for any run (``runs.start``);
then, instead of a tmux window, its job is submitted: ``job.sh`` in the run folder runs the run's own supervisor
under ``srun`` (one task per node), so restarts, checkpoints to resume from, budgets and the exit record are the
supervisor's as on a container. ``slurm.json`` keeps the job id. Slurm's commands are run with argument lists; the
one shell text is ``job.sh``, quoted by ``shlex``.

    slurm.json  {"job_id": "42", "partition": "gpu", "submitted": 1733.0, "nodes": 1}

States: a job Slurm holds back (PENDING) reads as ``queued`` with Slurm's reason; one that runs, as ``running`` on
its nodes; a job Slurm no longer lists that left no exit record ended without its supervisor (a node lost, a
``scancel`` before it started, a compute node without Python): ``crashed``, with that said.
"""

from __future__ import annotations

import os
import re
import time

from ..layout import read_json, write_atomic, write_json
from ..protocol import AgentFailure
from . import handover

JOB_FILE = "slurm.json"
LAUNCHER = "torchrun.json"  # a job over several nodes: each rank's torchrun line (``slurm_launch.py``)
SCRIPT = "job.sh"
FIELDS = ("job_id", "state", "reason", "nodes", "submitted", "start", "partition", "priority")
FORMAT = "%i|%T|%r|%N|%V|%S|%P|%Q"  # one squeue line: the FIELDS, in order
RUNNING = ("RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT")
ALLOCATION = ("CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES")  # what Slurm gives beside SLURM_*
TIMEOUT_S = 60.0  # a slurmctld that does not answer a command within this is reported, not waited for


def call(argv: list[str], what: str) -> subprocess.CompletedProcess:
    """One Slurm command; its absence is the login node's fault, said once here."""
    import subprocess  # (here: a status that reads no Slurm job imports none of it)

    try:
        return subprocess.run(argv, capture_output=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise AgentFailure("input", f"{argv[0]} is not on the login node's PATH: it is not a Slurm login node, or "
                                    "Slurm's commands are not installed there",
                           "point host = at the cluster's login node (the one where sbatch and squeue work)") from None
    except subprocess.TimeoutExpired:
        raise AgentFailure("agent", f"{argv[0]} did not answer within {TIMEOUT_S:g} s while {what}",
                           "check slurmctld (scontrol ping on the login node)") from None


def sbatch_argv(run_dir: str, spec: dict, *, test_only: bool = False) -> list[str]:
    """``sbatch``'s arguments for a run: the target's options, the run's ``gpus`` and ``nodes``, its output in the
    run folder (appended to, so that a requeued job keeps the first attempt's lines)."""
    nodes = int(spec.get("nodes") or 1)
    argv = ["sbatch", "--test-only" if test_only else "--parsable", f"--job-name={spec.get('name') or 'orch'}",
            f"--nodes={nodes}", "--ntasks-per-node=1", f"--output={os.path.join(run_dir, 'slurm-%j.out')}",
            "--open-mode=append", f"--chdir={run_dir}"]
    for key in ("partition", "account", "qos", "time"):
        if spec.get(key):
            argv.append(f"--{key}={spec[key]}")
    if spec.get("gpus"):
        argv.append(f"--gres=gpu:{int(spec['gpus'])}")
    if spec.get("signal"):
        argv.append(f"--signal={spec['signal']}")
    if spec.get("resubmit"):  # the run asks Slurm to requeue it at its time limit (``resubmit``)
        argv.append("--requeue")
    argv += [str(a) for a in spec.get("sbatch_args") or []]
    return argv + [os.path.join(run_dir, SCRIPT)]


def script(python: str, agent_path: str, run_dir: str) -> str:
    """``job.sh``: the run's supervisor on every node of the allocation, under ``srun`` so that a ``scancel
    --signal`` (which reaches a job's steps, not its batch shell) reaches it."""
    import shlex

    srun = ["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=0", python, agent_path, "supervise", run_dir]
    return f"#!/bin/sh\n# orch: the run's supervisor, one per node of this allocation\nexec {shlex.join(srun)}\n"


def refusal(said: str) -> tuple[str, str]:
    """Slurm's own words of a refused submission, and what to do about them."""
    words = " ".join(line.strip() for line in said.strip().splitlines() if line.strip())
    low = words.lower()
    if "account" in low or "association" in low:  # before partition: "Invalid account/partition combination"
        hint = "sacctmgr show assoc user=$USER lists your accounts; set account = \"...\" on the target"
    elif "partition" in low:
        hint = "sinfo on the login node lists the partitions; set partition = \"...\" on the target"
    elif "qos" in low:
        hint = "sacctmgr show qos lists them; set qos = \"...\" on the target (or leave it out)"
    elif "node configuration is not available" in low or "gres" in low:
        hint = "ask for fewer GPUs or nodes (orch gpus --target NAME shows what the nodes have)"
    elif "time limit" in low:
        hint = "set time = \"HH:MM:SS\" on the target within the partition's limit"
    else:
        hint = "fix the target's Slurm options (partition, account, qos, time, sbatch_args)"
    return words or "no reason given", hint


def check(layout, run_dir: str, spec: dict) -> dict:
    """``sbatch --test-only``: whether Slurm would take the job, asked before anything changes."""
    import tempfile

    os.makedirs(layout.root, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=layout.root, prefix=".sbatch-test-", suffix=".sh") as probe:
        probe.write("#!/bin/sh\n")  # sbatch reads the script even to test: the run folder is not made yet
        probe.flush()
        argv = sbatch_argv(run_dir, spec, test_only=True)
        proc = call(argv[:-1] + [probe.name], "testing the job")
    if proc.returncode != 0:
        words, hint = refusal(proc.stderr.decode("utf-8", "replace"))
        raise AgentFailure("input", f"Slurm refuses the job: {words}", hint)
    return {"ok": True, "said": proc.stderr.decode("utf-8", "replace").strip()[-300:]}


def submit(run_dir: str, python: str, agent_path: str, spec: dict) -> dict:
    """Write ``job.sh``, ``sbatch`` it, keep its id in ``slurm.json``."""
    if spec.get("torchrun"):  # each rank's launcher line, there before any node's supervisor starts
        write_json(os.path.join(run_dir, LAUNCHER), spec["torchrun"])
    path = os.path.join(run_dir, SCRIPT)
    write_atomic(path, script(python, agent_path, run_dir).encode())
    os.chmod(path, 0o755)
    proc = call(sbatch_argv(run_dir, spec), "submitting the job")
    if proc.returncode != 0:
        words, hint = refusal(proc.stderr.decode("utf-8", "replace"))
        raise AgentFailure("input", f"sbatch refused the job: {words}", hint)
    job_id = proc.stdout.decode().strip().split(";")[0]
    if not job_id.isdigit():
        raise AgentFailure("agent", f"sbatch answered {proc.stdout.decode()[:200]!r}, not a job id")
    record = {"job_id": job_id, "partition": spec.get("partition"), "submitted": time.time(),
              "nodes": int(spec.get("nodes") or 1), "resubmit": bool(spec.get("resubmit"))}
    write_json(os.path.join(run_dir, JOB_FILE), record)
    return record


def job_of(run_dir: str) -> dict | None:
    """The run's ``slurm.json``, or None for a run that is not a Slurm job."""
    found = read_json(os.path.join(run_dir, JOB_FILE))
    return found if isinstance(found, dict) and found.get("job_id") else None


def queue(job_ids: list[str]) -> dict[str, dict]:
    """What ``squeue`` says of these jobs, by id; a job it no longer lists is absent."""
    if not job_ids:
        return {}
    proc = call(["squeue", "-h", "-j", ",".join(job_ids), "-o", FORMAT], "reading the queue")
    if proc.returncode != 0:  # every id unknown: squeue refuses ("Invalid job id specified")
        return {}
    out = {}
    for line in proc.stdout.decode("utf-8", "replace").splitlines():
        parts = line.split("|")
        if len(parts) == len(FIELDS):
            out[parts[0]] = dict(zip(FIELDS, parts))
    return out


def state(job: dict, pid: dict, stop_requested: bool, listed: dict | None = None, run_dir: str | None = None) -> dict:
    """A run's state (``runs.run_state``'s fields) from its job, when its supervisor left no exit record."""
    found = (listed if listed is not None else queue([job["job_id"]])).get(job["job_id"])
    told = {"job_id": job["job_id"], "partition": job.get("partition")}
    if found is not None:
        told.update(state=found["state"], reason=found["reason"], partition=found["partition"] or job.get("partition"),
                    priority=found["priority"], start=found["start"])
        if found["state"] == "PENDING":  # waiting since Slurm's submit time (a requeue's, after one), else ours
            return {"state": "queued", "slurm": told | {"since": _epoch(found["submitted"]) or job.get("submitted")}}
        if found["state"] in RUNNING:
            return {"state": "running", "slurm": told | {"nodes": found["nodes"]}}
    if stop_requested:
        return {"state": "stopped", "slurm": told, "ended": None}
    said = _last_words(os.path.join(run_dir, f"slurm-{job['job_id']}.out")) if run_dir else None
    why = "its Slurm job ended without the supervisor's exit record" + (
        f": {said}" if said else " (node lost, cancelled, or no Python or no shared root on the compute node: see "
                                 f"slurm-{job['job_id']}.out in the run folder)")
    return {"state": "crashed", "slurm": told, "cause": why, "error": why, "lost": not pid}


def _epoch(stamp: str) -> float | None:
    """Slurm's ``2026-12-07T12:03:14`` (the cluster's local time, which the login node shares) as a timestamp, so
    that a client in another time zone shows it in its own."""
    try:
        return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None  # "N/A", "Unknown"


# srun's closing summary of a failed step: it follows the line that says why (``python3: not found``), and
# its order against that line depends on which process flushed first
SRUN_SUMMARY = re.compile(r"^srun: (error: \S+: tasks? [\d,-]+: |launch/|Job step aborted|error: Timed out)")


def _last_words(path: str) -> str | None:
    """Slurm's own words of why a job's step failed, from the end of its output: the last line that says why,
    then srun's summary of the step (``task 0: Exited with exit code 2``) if it wrote one."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 2000))
            lines = [ln.strip() for ln in fh.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        return None
    if not lines:
        return None
    summary = [ln for ln in lines if SRUN_SUMMARY.match(ln)]
    cause = next((ln for ln in reversed(lines) if not SRUN_SUMMARY.match(ln)), None)
    said = "; ".join(part for part in (cause, summary[-1] if summary else None) if part)
    return said[:300]


def cancel(job_id: str, signal: str | None = None) -> None:
    """``scancel`` (with ``signal``: that signal to the job's steps, the supervisors); a job already gone is not
    an error."""
    argv = ["scancel"] + ([f"--signal={signal}"] if signal else []) + [job_id]
    proc = call(argv, "cancelling the job")
    said = proc.stderr.decode("utf-8", "replace").strip()
    if proc.returncode != 0 and "already completing or completed" not in said and "Invalid job id" not in said:
        raise AgentFailure("agent", f"scancel {job_id} failed: {said[-300:]}")


def stop(run_dir: str, job: dict, stop_timeout: float, term_timeout: float, running: bool) -> list[str]:
    """SIGINT to the supervisors, ``stop_timeout`` for the final checkpoint, then ``scancel``; a pending job is
    cancelled at once. Returns the signals sent. The secrets no node's supervisor took are removed."""
    try:
        return _stop(run_dir, job, stop_timeout, term_timeout, running)
    finally:
        handover.drop(run_dir)


def _stop(run_dir: str, job: dict, stop_timeout: float, term_timeout: float, running: bool) -> list[str]:
    exit_path = os.path.join(run_dir, "exit.json")
    if not running:
        cancel(job["job_id"])
        return []
    cancel(job["job_id"], "INT")
    if _until(lambda: os.path.exists(exit_path) or job["job_id"] not in queue([job["job_id"]]), stop_timeout):
        return ["SIGINT"]
    cancel(job["job_id"])  # Slurm's own end: SIGTERM, KillWait, SIGKILL
    _until(lambda: job["job_id"] not in queue([job["job_id"]]), term_timeout + 10)
    return ["SIGINT", "scancel"]


def _until(done, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while True:
        if done():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.3)


def allocation(environ: dict) -> dict:
    """The variables of the Slurm allocation the supervisor runs in, which the run keeps over the launch's own."""
    return {k: v for k, v in environ.items() if k.startswith(("SLURM_", "SLURMD_")) or k in ALLOCATION}


REQUEUE_WINDOW_S = 900.0  # how long after a run's exit record a pending job of its id is taken as requeued


def requeued(job: dict, ended: dict) -> bool:
    """Whether a run whose supervisor recorded an end is pending again: its job was requeued (its exit record is
    the killed attempt's; the next attempt resumes from the newest checkpoint). Asked of ``squeue`` only for a
    recent end that was not a stop, so that a status of many old runs costs no Slurm call each."""
    if ended.get("not_started") or time.time() - float(ended.get("ended") or 0) > REQUEUE_WINDOW_S:
        return False
    found = queue([job["job_id"]]).get(job["job_id"])
    return found is not None and found["state"] == "PENDING"


def settled(run_dir: str, job: dict, ended: dict) -> None:
    """A run whose exit record is its last (a stop, an end past the requeue window, or its job gone from Slurm's
    queue): the secrets each attempt read are removed. Slurm is asked only while some are left."""
    folder = os.path.join(run_dir, handover.FOLDER)
    try:
        if not os.listdir(folder):
            return
    except OSError:
        return
    recent = time.time() - float(ended.get("ended") or 0) <= REQUEUE_WINDOW_S
    stopped = os.path.exists(os.path.join(run_dir, "stop_requested"))
    if recent and not stopped and job["job_id"] in queue([job["job_id"]]):
        return  # still listed (completing, or requeued between the two looks): it may run again
    handover.drop(run_dir)


def resumes(folder: str, environ: dict, run_dir: str | None = None) -> bool:
    """In a requeued job (``SLURM_RESTART_COUNT`` > 0): the attempt Slurm killed left an exit record in this
    node's ``folder``, which is set aside so that this supervisor goes on with the same run, as its next attempt.
    ``run_dir``: the run folder (where the job and a stop are recorded), when ``folder`` is a later node's."""
    run_dir = run_dir or folder
    restarts = environ.get("SLURM_RESTART_COUNT", "")
    if not restarts.isdigit() or int(restarts) < 1 or job_of(run_dir) is None:
        return False
    if os.path.exists(os.path.join(run_dir, "stop_requested")):
        return False
    path = os.path.join(folder, "exit.json")
    ended = read_json(path, {}) or {}
    if ended.get("not_started"):
        return False
    os.replace(path, os.path.join(folder, f"exit-requeued-{restarts}.json"))
    return True


def _pairs(line: str) -> dict:
    """``Key=value`` words of one ``scontrol show -o`` line (values with spaces, like ``OS=``, are cut: unused)."""
    return dict(word.split("=", 1) for word in line.split() if "=" in word)


def _gpu_count(text: str) -> int:
    """GPUs in a GRES or TRES list: ``gpu:2``, ``gpu:a100:4(S:0-1)``, ``cpu=1,gres/gpu=1``."""
    total = 0
    for part in text.replace(",", " ").split():
        if part.startswith("gres/gpu="):
            total += int(part.split("=", 1)[1]) if part.split("=", 1)[1].isdigit() else 0
        elif part.startswith("gpu"):
            count = part.split("(")[0].split(":")[-1]
            total += int(count) if count.isdigit() else 0
    return total


def nodes(layout) -> dict:
    """``orch gpus`` on a Slurm target: each node's GPUs (GRES), how many are allocated, its state and partitions,
    and the running jobs on it (an orch experiment's job is named ``orch-<project>-<id>``)."""
    shown = call(["scontrol", "show", "-d", "-o", "node"], "reading the nodes")  # -d: GresUsed
    if shown.returncode != 0:
        raise AgentFailure("agent", f"scontrol show node failed: {shown.stderr.decode('utf-8', 'replace')[-300:]}")
    running = call(["squeue", "-h", "-t", "RUNNING", "-o", "%i|%u|%j|%N|%b"], "reading the queue")
    jobs: dict[str, list] = {}
    for line in running.stdout.decode("utf-8", "replace").splitlines() if running.returncode == 0 else []:
        parts = line.split("|")
        if len(parts) == 5:
            for node in expand(parts[3]):
                jobs.setdefault(node, []).append({"job_id": parts[0], "user": parts[1], "name": parts[2],
                                                  "gres": parts[4]})
    out = []
    for line in shown.stdout.decode("utf-8", "replace").splitlines():
        facts = _pairs(line)
        if not facts.get("NodeName"):
            continue
        name = facts["NodeName"]
        out.append({"node": name, "state": facts.get("State", "?"), "partitions": facts.get("Partitions", ""),
                    "gpus": _gpu_count(facts.get("Gres", "")),
                    "gpus_used": max(_gpu_count(facts.get("GresUsed", "")), _gpu_count(facts.get("AllocTRES", ""))),
                    "jobs": jobs.get(name, [])})
    return {"nodes": out}


def expand(nodelist: str) -> list[str]:
    """Slurm's host list as names (``scontrol show hostnames``): ``ct[210-211]`` -> ``ct210``, ``ct211``."""
    if not nodelist or nodelist in ("(null)", "None"):
        return []
    proc = call(["scontrol", "show", "hostnames", nodelist], "expanding a node list")
    return proc.stdout.decode("utf-8", "replace").split() if proc.returncode == 0 else [nodelist]


NODE_FILES = ("launch.json", "launch-env.json", "experiment.json", "batching.json")  # every node's supervisor reads


def node_folder(run_dir: str, environ: dict) -> str:
    """The folder this node's supervisor keeps its log, pid and exit records in: the run folder on the job's first
    node, ``nodes/<rank>/`` in it on the others (one shared file system: each node writes its own files)."""
    rank = environ.get("SLURM_NODEID", "0")
    if not rank.isdigit() or int(rank) == 0 or job_of(run_dir) is None:
        return run_dir
    own = os.path.join(run_dir, "nodes", rank)
    os.makedirs(own, exist_ok=True)
    for name in NODE_FILES:
        link = os.path.join(own, name)
        if not os.path.lexists(link) and os.path.exists(os.path.join(run_dir, name)):
            os.symlink(os.path.join("..", "..", name), link)
    return own


def node_env(environ: dict, port: int = 29400) -> dict:
    """A job over several nodes: the variables a run of a job over CTs gets (``launch/distributed.py``), from the
    allocation's."""
    count = environ.get("SLURM_NNODES") or environ.get("SLURM_JOB_NUM_NODES") or ""
    if not count.isdigit() or int(count) < 2:
        return {}
    names = expand(environ.get("SLURM_JOB_NODELIST", ""))
    return {"ORCH_NNODES": count, "ORCH_NODE_RANK": environ.get("SLURM_NODEID", "0"),
            "ORCH_NODE_ADDRS": " ".join(names), "ORCH_MASTER_ADDR": names[0] if names else "",
            "ORCH_MASTER_PORT": str(port)}


def doctor(layout, partition: str | None = None, time_limit: str | None = None) -> dict:
    """``orch doctor`` on a Slurm target, from the login node: the controller answers, the partition is there and
    up (and whether a time limit must be given), a compute node runs Python 3.10+ and sees ``root`` writable,
    and whether Slurm confines a job to its GPUs. Findings as ``watch/doctor_checks.Finding``'s fields."""
    out = []

    def finding(check: str, status: str, reason: str, fix: str | None = None) -> None:
        out.append({"check": check, "status": status, "reason": reason, "fix": fix})

    ping = call(["scontrol", "ping"], "asking the controller")
    said = (ping.stdout + ping.stderr).decode("utf-8", "replace").strip()
    finding("slurmctld", "ok" if ping.returncode == 0 and "UP" in said else "fail", said or "no answer",
            "ask the cluster's admins: slurmctld does not answer")
    shown = call(["scontrol", "show", "-o", "partition"] + ([partition] if partition else []), "reading partitions")
    parts = [_pairs(line) for line in shown.stdout.decode("utf-8", "replace").splitlines() if "PartitionName=" in line]
    chosen = next((p for p in parts if not partition and p.get("Default") == "YES" or
                   partition and p.get("PartitionName") == partition), None)
    if shown.returncode != 0 or chosen is None:
        words = shown.stderr.decode("utf-8", "replace").strip() or "no default partition"
        finding("partition", "fail", f"{partition or 'the default partition'}: {words}",
                "sinfo lists the partitions; set partition = \"...\" on the target")
    else:
        name, state = chosen.get("PartitionName"), chosen.get("State", "?")
        finding("partition", "ok" if state == "UP" else "fail", f"{name}: {state}, {chosen.get('TotalNodes')} "
                f"node(s), time limit {chosen.get('MaxTime')}", "ask the admins why the partition is not up")
        if chosen.get("DefaultTime") in (None, "NONE") and chosen.get("MaxTime") != "UNLIMITED" and not time_limit:
            finding("time limit", "warn", f"partition {name} has no default time: a job without one gets "
                    f"{chosen.get('MaxTime')}", "set time = \"HH:MM:SS\" on the target")
    root = layout.root
    probe = "import os, sys; print(sys.version_info[0], sys.version_info[1], os.access(sys.argv[1], os.W_OK))"
    argv = ["srun", "-N1", "-n1", "--immediate=30", "--time=1"] + ([f"--partition={partition}"] if partition else []) \
        + [sys_python(), "-c", probe, root]
    ran = call(argv, "trying a compute node")
    text = ran.stdout.decode("utf-8", "replace").split()
    if ran.returncode == 0 and len(text) >= 3:
        good = (int(text[0]), int(text[1])) >= (3, 10)
        finding("compute node python", "ok" if good else "fail", f"python {text[0]}.{text[1]} on a compute node",
                "install Python 3.10+ on the compute nodes at the login node's path")
        finding("shared root", "ok" if text[2] == "True" else "fail", f"{root} is "
                + ("writable" if text[2] == "True" else "not writable") + " on a compute node",
                "set root = \"...\" to a folder of the shared file system that compute nodes mount")
    else:
        why = ran.stderr.decode("utf-8", "replace").strip().splitlines()
        last = why[-1] if why else "no answer"
        finding("compute node", "warn", f"could not run on a compute node within 30 s: {last}",
                "run orch doctor again when a node is free")
    config = _pairs(call(["scontrol", "show", "config"], "reading the config").stdout.decode("utf-8", "replace")
                    .replace(" = ", "="))
    plugins = config.get("TaskPlugin", "")
    finding("gpu confinement", "ok" if "cgroup" in plugins else "warn",
            f"TaskPlugin={plugins or '?'}" + ("" if "cgroup" in plugins else ": a job sees every GPU of its node "
                                              "(CUDA_VISIBLE_DEVICES only says which are its own)"),
            "the admins enable task/cgroup with ConstrainDevices=yes (needs cgroup delegation)")
    return {"findings": out}


def sys_python() -> str:
    import sys

    return sys.executable


def resubmit(run_dir: str, environ: dict) -> bool:
    """A run whose target has ``resubmit`` and that a signal ended without ``orch stop`` (the time limit's,
    ``signal``): its job is requeued from its first node, so the same run goes on in a new allocation. Whether
    it was."""
    job = job_of(run_dir)
    if job is None or not job.get("resubmit") or environ.get("SLURM_NODEID", "0") != "0":
        return False
    if environ.get("SLURM_JOB_ID") != job["job_id"]:
        return False
    return call(["scontrol", "requeue", job["job_id"]], "requeueing the job").returncode == 0
