"""The chaos test, long: N seeded cycles over the LXC testbed (see ``tests/testbed/chaos.py``), then a summary:
cycles, actions, faults by kind, CLI exit codes, violations (each with its seed, cycle, action and fault), wall time.

    python benchmarks/bench_chaos.py --cycles 100 --seed 3

Needs root and LXC, like the testbed tests; waits for the testbed's session lock. Exits 1 if an invariant broke.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quiet", action="store_true", help="no line per cycle")
    a = ap.parse_args()
    from tests.integration.conftest import Testbed
    from tests.testbed import lxc
    from tests.testbed.chaos import Chaos

    work = Path(tempfile.mkdtemp(prefix="orch-bench-chaos-"))
    (work / "bed").mkdir()
    try:
        with lxc.session_lock():
            bed = Testbed(work / "bed")
            try:
                bed.setup()
                bed.reset(200)
                bed.reset(201)
                with Chaos(bed, work / "clones", seed=a.seed) as chaos:
                    summary = chaos.run(a.cycles, log=None if a.quiet else lambda line: print(line, flush=True))
            finally:
                bed.teardown()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("chaos over CTs 200 and 201: two clones on CT 200 and a 2-node job, one action per cycle, a fault in "
          "about three quarters of the cycles")
    print(summary.table())
    print(summary.report())
    sys.exit(1 if summary.violations else 0)


if __name__ == "__main__":
    main()
