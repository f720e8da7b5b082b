"""How a Slurm job ended as ``sacct --parsable2 --noheader`` prints it (Slurm's documented output)."""

from __future__ import annotations

from orchestrator.agent.run import sacct
from orchestrator.cli.status import _accounted

# sacct -n -P -o JobID,State,ExitCode,Elapsed (without -X: the job's steps follow its own row)
SAID = """\
41|COMPLETED|0:0|00:01:02
41.batch|COMPLETED|0:0|00:01:02
41.0|COMPLETED|0:0|00:01:01
42|CANCELLED by 0|0:15|00:00:09
42.batch|CANCELLED|0:15|00:00:09
43|FAILED|3:0|00:00:01
43|TIMEOUT|0:0|00:10:00
44+0|COMPLETED|0:0|00:00:01
"""


def test_each_jobs_own_row_read_steps_and_parts_passed_over() -> None:
    rows = sacct.parse(SAID)
    assert rows["41"] == {"job_id": "41", "state": "COMPLETED", "exit_code": "0:0", "elapsed": "00:01:02"}
    assert rows["42"]["state"] == "CANCELLED"  # "by 0": who cancelled it
    assert rows["43"]["state"] == "TIMEOUT"  # a requeued job's completion log: its last end
    assert set(rows) == {"41", "42", "43"}


def test_status_says_it_only_where_sacct_answered() -> None:
    assert _accounted({"state": "FAILED", "exit_code": "3:0", "elapsed": "00:00:01"}) == \
        "; sacct: FAILED, exit code 3:0, ran 00:00:01"
    assert _accounted(None) == "" and _accounted({}) == ""
