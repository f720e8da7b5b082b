"""Placement by GPUs as a pure choice: the machines' reports in, the machine and GPUs (or a refusal) out."""

from __future__ import annotations

import pytest

from orchestrator.errors import ConflictError, InputError
from orchestrator.launch.placement import candidates, choose
from orchestrator.reach.gpu_facts import gpus_of


def machine(*uses):
    """A report with one GPU per item: None free, "mine"/"theirs" held by this project's run / another's,
    an int a process of no run."""
    gpus, apps = [], []
    for i, use in enumerate(uses):
        gpus.append({"index": str(i), "uuid": f"GPU-{i}"})
        if use == "mine":
            apps.append({"pid": "10", "gpu_uuid": f"GPU-{i}", "owner": {"id": 3, "project": "tinylm"}})
        elif use == "theirs":
            apps.append({"pid": "11", "gpu_uuid": f"GPU-{i}", "owner": {"id": 8, "project": "other"}})
        elif use is not None:
            apps.append({"pid": str(use), "gpu_uuid": f"GPU-{i}", "owner": None})
    return {"gpus": gpus_of({"gpus": gpus, "apps": apps})}


def test_the_first_machine_with_n_free_gpus_is_chosen_and_why_is_said():
    got = choose([("a", "CT 200", machine(None, 4411)), ("b", "CT 201", machine(None, None, None))], 2, "tinylm")
    assert got.key == "b" and got.gpus == [{"index": 0, "uuid": "GPU-0"}, {"index": 1, "uuid": "GPU-1"}]
    assert got.reason == "CT 201: 3 of 3 GPUs free; the run gets GPUs 0,1"
    assert got.others == ["CT 200: 1 of 2 free (GPU 1: busy: pid 4411, not orch's)"]


def test_free_gpus_are_taken_before_those_the_launch_would_free():
    got = choose([("a", "CT 200", machine("mine", None)), ("b", "CT 201", machine(4411, None, None))], 2, "tinylm")
    assert got.key == "b" and [g["index"] for g in got.gpus] == [1, 2]
    got = choose([("a", "CT 200", machine("mine", None)), ("b", "CT 201", machine(4411, None))], 2, "tinylm")
    assert got.key == "a" and [g["index"] for g in got.gpus] == [1, 0]
    assert "exp 3 (tinylm) of this project holds the rest: this launch stops it first" in got.reason


def test_another_projects_run_is_not_freed_and_a_refusal_names_every_holder():
    with pytest.raises(ConflictError) as err:
        choose([("a", "CT 200", machine("theirs", None)), ("b", "CT 201", {"error": "no answer within 25 s"})],
               2, "tinylm")
    assert err.value.message == ("no 2 free GPUs on any of the 2 machines: CT 200: 1 of 2 free "
                                 "(GPU 0: exp 8 (other)); CT 201: no answer within 25 s")
    assert err.value.exit_code == 5


def test_bad_requests():
    with pytest.raises(InputError):
        choose([("a", "local", machine(None))], 0, "tinylm")
    with pytest.raises(ConflictError, match="no 1 free GPU on the machine: local: 0 of 0 free"):
        choose([("a", "local", {"gpus": []})], 1, "tinylm")


def test_candidates_from_flags_and_pools():
    from orchestrator.config import Settings

    settings = Settings.model_validate({"pools": {"big": {"members": ["local", 201]}}})
    assert candidates(settings, ["local"], [200, 201], None) == [("local", None), (None, 200), (None, 201)]
    assert candidates(settings, None, None, "big") == [("local", None), (None, 201)]
    assert candidates(settings, None, None, None) == [(None, None)]
    with pytest.raises(InputError, match="--pool names the machines already"):
        candidates(settings, None, [200], "big")


def test_a_group_target_is_not_a_machine_to_place_on():
    from orchestrator.config import Settings

    settings = Settings.model_validate({"targets": {"a": {"kind": "local", "root": "/x"},
                                                    "pair": {"kind": "group", "members": ["local", "a"]}}})
    with pytest.raises(InputError, match="target 'pair' is a group"):
        candidates(settings, ["pair"], None, None)
