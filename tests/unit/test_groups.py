"""`python tests/groups.py` (what `make test` runs): the slowest tests of each group are listed at the end."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent


def test_the_slowest_tests_of_each_group_are_listed_at_the_end(tmp_path):
    selection = ["tests/unit/test_jumps.py", "-k", "hops_are_read or none_and_empty", "-p", "no:cacheprovider"]
    env = dict(os.environ, ORCH_TESTBED_SPLIT="0")  # one testbed group: no second testbed for this
    proc = subprocess.run([sys.executable, "tests/groups.py", *selection], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    # after both groups' own output, before the time per group: one line per test, longest first, as pytest ids
    assert out.index("===== local tests =====") < out.index("slowest local tests") < out.index("time per group")
    listed = out.split("slowest local tests =====\n", 1)[1].split("\n\n", 1)[0].splitlines()
    ran = int(re.search(r"(\d+) passed", out.split("===== local tests =====", 1)[1]).group(1))
    assert len(listed) == min(ran, 15) and ran > 1
    times = [float(line.split()[0]) for line in listed]
    assert times == sorted(times, reverse=True)
    ids = [line.split(" s  ", 1)[1] for line in listed]
    assert "tests/unit/test_jumps.py::test_none_and_empty_mean_no_jump" in ids
    assert all(i.startswith("tests/unit/test_jumps.py::test_") for i in ids), ids
    # a group that selected nothing lists nothing
    assert "slowest testbed tests" not in out
