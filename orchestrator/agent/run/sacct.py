"""How a Slurm job ended, as Slurm's accounting tells it (``sacct``), beside the supervisor's own record.

Clusters differ: with a ``slurmdbd``, ``sacct`` answers from the accounting store; with only a job completion log
(``JobCompType=jobcomp/filetxt``) it answers with ``-c``; with neither it says so ("... is disabled") and a status
says nothing more than the supervisor's record. One ``sacct`` call (two where the first store is off) answers for
every ended run of a status; what it said is kept in the run folder, keyed by the run's end, so that the next
status asks nothing and a requeued job's next end is asked again.

    sacct.json  {"ended": 1733.0, "job_id": "42", "state": "COMPLETED", "exit_code": "0:0", "elapsed": "00:01:02"}
                {"ended": 1733.0, "off": true}      neither store is on: not asked again for this end
"""

from __future__ import annotations

import os

from ..layout import read_json, write_json
from ..protocol import AgentFailure
from .slurm import call, job_of

FILE = "sacct.json"
FIELDS = ("job_id", "state", "exit_code", "elapsed")
#: states after which Slurm changes nothing more about the job (a PENDING/RUNNING/REQUEUED row is asked again)
OVER = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL",
        "DEADLINE")
ENDED = ("finished", "crashed", "stopped")


def parse(text: str) -> dict[str, dict]:
    """``sacct -n -P -o JobID,State,ExitCode,Elapsed`` lines by job id; the last line of an id wins (a requeued
    job's completion log has one line per end), and ``CANCELLED by 0`` is ``CANCELLED``."""
    out: dict[str, dict] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < len(FIELDS) or not parts[0].isdigit():
            continue  # a step's row (42.batch) or a heterogeneous job's part (42+0)
        row = dict(zip(FIELDS, parts))
        row["state"] = row["state"].split()[0] if row["state"].strip() else "?"
        out[parts[0]] = row
    return out


def ask(job_ids: list[str]) -> dict[str, dict] | None:
    """What Slurm's accounting (else its job completion log) says of these jobs; None when neither is on."""
    base = ["sacct", "-n", "-P", "-j", ",".join(job_ids), "-o", "JobID,State,ExitCode,Elapsed"]
    for extra in (["-X"], ["-c"]):  # -X: the allocation's row, not each step's; -c: the completion log
        proc = call(base[:1] + extra + base[1:], "reading Slurm's accounting")
        said = proc.stderr.decode("utf-8", "replace")
        if proc.returncode == 0:
            return parse(proc.stdout.decode("utf-8", "replace"))
        if "disabled" not in said:
            raise AgentFailure("agent", f"sacct failed: {said.strip()[-300:]}")
    return None


def known(run_dir: str, ended) -> dict | None:
    """What ``sacct`` said of this run's end, kept from an earlier status (``{"off": True}`` when nothing can)."""
    found = read_json(os.path.join(run_dir, FILE))
    return found if isinstance(found, dict) and found.get("ended") == ended else None


def tell(runs: list[dict], run_dirs: list[str]) -> None:
    """Add ``sacct``'s word to the ``slurm`` of each ended Slurm run among ``runs`` (``runs.run_state``'s, in the
    order of ``run_dirs``), asking Slurm once for those it has not told yet. A ``sacct`` that fails or is missing
    leaves the runs as they are: the supervisor's record says how they ended."""
    asking: dict[str, tuple[dict, str, dict]] = {}
    for state, run_dir in zip(runs, run_dirs):
        if state.get("state") not in ENDED:
            continue
        job = job_of(run_dir)
        if job is None:
            continue
        kept = known(run_dir, state.get("ended"))
        if kept is None:
            asking[job["job_id"]] = (state, run_dir, job)
        elif not kept.get("off"):
            _attach(state, job, kept)
    if not asking:
        return
    try:
        found = ask(sorted(asking, key=int))
    except AgentFailure:
        return
    for job_id, (state, run_dir, job) in asking.items():
        row = None if found is None else found.get(job_id)
        if found is None:
            _keep(run_dir, {"ended": state.get("ended"), "off": True})
        elif row is not None and row["state"] in OVER:
            _keep(run_dir, {"ended": state.get("ended"), **row})
            _attach(state, job, row)


def _keep(run_dir: str, said: dict) -> None:
    try:
        write_json(os.path.join(run_dir, FILE), said)
    except OSError:
        pass  # a run folder this login node cannot write: asked again next time, nothing lost


def _attach(state: dict, job: dict, row: dict) -> None:
    told = state.get("slurm") or {"job_id": job["job_id"], "partition": job.get("partition")}
    state["slurm"] = told | {"sacct": {k: row.get(k) for k in ("state", "exit_code", "elapsed")}}
