"""The chaos test, short: 20 seeded cycles of deploy / restart --clean-checkpoints / stop from two clones of one
project on CT 200, a random fault in about three quarters of them, and every invariant checked after each cycle (see
``tests/testbed/chaos.py``). The long version is ``benchmarks/bench_chaos.py``. Set ``ORCH_CHAOS_SEED`` to
replay another seed."""

from __future__ import annotations

import os

import pytest

from tests.testbed.chaos import Chaos

pytestmark = pytest.mark.testbed

SEED = int(os.environ.get("ORCH_CHAOS_SEED", "49204"))  # its 20 cycles meet every kind of fault, a long lock once
CYCLES = 20


def test_records_checkpoints_and_messages_stay_true_under_random_faults(testbed, ct200, tmp_path):
    with Chaos(testbed, tmp_path, seed=SEED) as chaos:
        summary = chaos.run(CYCLES, log=print)
    print(summary.table())
    assert summary.cycles == CYCLES
    assert not summary.violations, f"{len(summary.violations)} invariant(s) broken (replay: " \
                                   f"ORCH_CHAOS_SEED={SEED}):\n{summary.report()}"
