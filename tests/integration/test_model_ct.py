"""The model-based test (``tests/testbed/model.py``): hypothesis's stateful machine mixes deploy, restart,
--beside, --queue, --guard, sweeps, stops, pulls, Ctrl-C at random moments, graceful and hard container stops and
shells with different environments on CT 200 over SSH, and checks after every step that a run resumes only from
its lineage's checkpoints, the project keeps a run unless the user stopped it, each run's environment is its
launch's, the records match the target, no secret is at rest there and no checkpoint was lost.

A fixed seed and few steps here; ``ORCH_MODEL_STEPS=200`` (and ``ORCH_MODEL_SEED``) runs it long, and
``ORCH_MODEL_DUMP=FILE`` keeps what the target held at the end."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.testbed.model import World, run

pytestmark = pytest.mark.testbed

SEED = int(os.environ.get("ORCH_MODEL_SEED", "22"))  # its 20 steps: --beside, then a deploy that resumes
STEPS = int(os.environ.get("ORCH_MODEL_STEPS", "20"))


def test_the_invariants_hold_over_a_seeded_sequence_of_mixed_actions(testbed, ct200, tmp_path):
    world = World(testbed, tmp_path)
    try:
        summary = run(world, STEPS, SEED)
    finally:
        world.close()
        if os.environ.get("ORCH_MODEL_DUMP"):  # the target as the last step left it, to read after a failure
            Path(os.environ["ORCH_MODEL_DUMP"]).write_text(json.dumps(world.before, indent=1))
    print(summary.table())
    assert summary.steps == STEPS
    assert not summary.violations, f"{len(summary.violations)} invariant(s) broken (replay: ORCH_MODEL_SEED={SEED} " \
                                   f"ORCH_MODEL_STEPS={STEPS}):\n{summary.report()}"
