"""The one seam between a launch and who runs it: orch's own supervisor on each box, or Slurm."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from orchestrator.config import Settings
from orchestrator.errors import InputError
from orchestrator.launch import scheduler
from orchestrator.launch.model import StartRun, StopRun
from orchestrator.reach.targets import planned_target, target_spec

SETTINGS = Settings(targets={"lab": {"kind": "slurm", "host": "login.lab"}, "box": {"kind": "ssh", "host": "b"}})


def _of(name: str):
    return scheduler.of(planned_target(SETTINGS, *target_spec(SETTINGS, name)))


def test_each_target_has_its_kind_of_scheduler() -> None:
    assert (_of("lab").kind, _of("box").kind, _of("local").kind) == ("slurm", "direct", "direct")
    assert scheduler.named(SETTINGS, ["lab"], None).kind == "slurm"
    assert scheduler.named(SETTINGS, ["lab", "box"], None).kind == "direct"  # several: a job over boxes
    assert scheduler.named(SETTINGS, None, [200]).kind == "direct"
    assert scheduler.named(SETTINGS.model_copy(update={"default_target": "lab"}), None, None).kind == "slurm"


def test_slurm_places_and_queues_and_orch_does_on_its_own_boxes() -> None:
    slurm, direct = _of("lab"), _of("box")
    assert (slurm.places, slurm.queues, direct.places, direct.queues) == (False, True, True, False)
    assert slurm.resources(2, 3) == {"gpus": 2, "nodes": 3} and direct.resources(2, None) is None
    with pytest.raises(InputError) as refused:
        direct.resources(None, 2)
    assert "--nodes asks Slurm for nodes" in refused.value.message and "--ct 200 --ct 201" in refused.value.hint
    assert slurm.recovery({"restarts": 2, "resume_after_reboot": True}) == {"restarts": 2,
                                                                          "resume_after_reboot": False}


def test_a_queued_slurm_job_is_submitted_beside_the_running_one() -> None:
    @dataclass
    class Plan:
        actions: tuple

    start = StartRun(label="start", command="python3 train.py", argv=("python3", "train.py"), strategy="megabatch")
    stop = StopRun(label="stop")
    assert _of("lab").queued(Plan((stop, start))).actions == (start,)
