"""`python tests/groups.py` (what `make test` runs): the slowest tests of each group are listed at the end."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.groups import SHARDS

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


def test_each_failed_test_is_named_at_the_end_with_why(tmp_path):
    # CI's output is cut to its tail: the failed tests must be there, not only in their group's output above
    (tmp_path / "test_broken.py").write_text("def test_fine():\n    pass\n\n\n"
                                             "def test_broken():\n    assert 1 == 2, 'the reason it broke'\n")
    env = dict(os.environ, ORCH_TESTBED_SPLIT="0")
    proc = subprocess.run([sys.executable, "tests/groups.py", str(tmp_path / "test_broken.py"), "-p",
                           "no:cacheprovider"], cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    tail = proc.stdout.rsplit("===== local tests =====", 1)[1].split("time per group", 1)[0]
    named = [line for line in tail.splitlines() if line.startswith("===== failed in ")]
    assert len(named) == 1 and named[0].startswith("===== failed in local: ") and "test_broken" in named[0], tail
    assert "the reason it broke" in tail.split(named[0], 1)[1]
    assert "test_fine" not in "".join(named)


SHARED = ["tests/unit/test_jumps.py", "tests/unit/test_end_reason.py", "tests/unit/test_heartbeat.py",
          "-m", "not testbed", "-p", "no:cacheprovider", "-q", "-rA"]


def passed(out: str) -> list[str]:
    return [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("PASSED ")]


def test_the_two_local_groups_deal_the_files_out_as_they_get_free(tmp_path):
    def group(shard: str, claims: Path) -> subprocess.Popen:
        env = dict(os.environ, ORCH_LOCAL_SHARD=shard, ORCH_CLAIMS=str(claims))
        return subprocess.Popen([sys.executable, "-m", "pytest", *SHARED], cwd=REPO, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    unshared = {k: v for k, v in os.environ.items() if k not in ("ORCH_CLAIMS", "ORCH_LOCAL_SHARD")}  # the suite's
    every = subprocess.run([sys.executable, "-m", "pytest", *SHARED], cwd=REPO, capture_output=True, text=True,
                           timeout=300, env=unshared)
    assert every.returncode == 0, every.stdout
    tests = passed(every.stdout)
    assert len({t.split("::")[0] for t in tests}) == 3
    # a group alone takes every file; the other, coming later, finds nothing left and says so
    (tmp_path / "one").mkdir()
    alone = group("b", tmp_path / "one")
    out, _ = alone.communicate(timeout=300)
    assert alone.returncode == 0, out
    assert sorted(passed(out)) == sorted(tests)
    later = group("a", tmp_path / "one")
    out, _ = later.communicate(timeout=300)
    assert later.returncode == 0, out
    assert passed(out) == [] and f"{len(tests)} deselected" in out
    # both at once: each test runs once, and each file in one group only
    (tmp_path / "two").mkdir()
    first, second = group("a", tmp_path / "two"), group("b", tmp_path / "two")
    outs = [first.communicate(timeout=300)[0], second.communicate(timeout=300)[0]]
    assert first.returncode == second.returncode == 0, outs
    ran = [passed(o) for o in outs]
    assert sorted(ran[0] + ran[1]) == sorted(tests)
    assert not {t.split("::")[0] for t in ran[0]} & {t.split("::")[0] for t in ran[1]}


def _collected_files(shard: str, claims: Path) -> list[str]:
    inherited = {k: v for k, v in os.environ.items() if k not in SHARDS}  # the group running this test's own
    env = dict(inherited, ORCH_TESTBED_SHARD=shard, ORCH_CLAIMS=str(claims))
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "testbed", "tests/integration",
                           "-p", "no:cacheprovider"], cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return list(dict.fromkeys(line.split("::")[0] for line in proc.stdout.splitlines() if "::" in line))


def test_the_second_testbed_group_may_take_every_file_but_those_that_need_the_network(tmp_path):
    from tests.integration.conftest import LONGEST, NEEDS_NETWORK

    first, second = _collected_files("a", tmp_path), _collected_files("b", tmp_path)
    every = sorted(p.name for p in (REPO / "tests" / "integration").glob("test_*.py"))
    assert sorted(Path(f).name for f in first) == every  # collected only: nothing claimed, nothing ran
    assert sorted(Path(f).name for f in second) == sorted(set(every) - NEEDS_NETWORK)
    assert "tests/integration/test_slurm_ct.py" in second
    # longest first, so that what is left at the end is short; the first begins with what only it can run
    assert [Path(f).name for f in second[:len(LONGEST)]] == list(LONGEST)
    assert {Path(f).name for f in first[:len(NEEDS_NETWORK)]} == NEEDS_NETWORK
    assert set(LONGEST) <= set(every) and not set(LONGEST) & NEEDS_NETWORK
