"""The whole suite as groups run at once: the testbed's tests (real LXC containers, mostly waiting on them) and
the local ones, each in a pytest process of its own. The local tests are two groups, ``local`` and ``local-b``
(half of the files each: ``ORCH_LOCAL_SHARD`` in ``tests/conftest.py``), as are the testbed's, ``testbed`` and
``testbed-b``, each with a testbed of its own (the second in namespaces of its own: ``tests/testbed/instance.py``;
which files the second may not run: ``NEEDS_NETWORK`` in ``tests/integration/conftest.py``), unless LXC cannot run here
or ``ORCH_TESTBED_SPLIT=0``. The two groups of a pair deal their files out as they run (``tests/claims.py``): each
takes the next file, heaviest first, when it is free, so both end together. Each group's output is printed whole
once it ends, then the slowest tests of each group (setup, call and teardown together), each failed test with the
first line of why, the time per group and one closing line with the totals.

    python tests/groups.py              # what `make test` runs
    python tests/groups.py -x -k keeper # arguments go to every pytest process

The exit code is 0 only when every group passed (a group that selects no test counts as passed).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script: the tests package is imported from the checkout
NO_TESTS = 5  # pytest's exit code when nothing was selected
COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|deselected|xfailed|xpassed)")
SHARDS = ("ORCH_LOCAL_SHARD", "ORCH_TESTBED_SHARD", "ORCH_CLAIMS")  # which half of the tests a group runs
SLOWEST = 15  # tests listed per group at the end: CI's output is the only record of where the time went


def totals(output: str) -> dict[str, int]:
    """The counts on pytest's closing line (``3 failed, 120 passed, 2 skipped in 61.2s``)."""
    lines = [line for line in output.splitlines() if re.search(r"\bin [\d.]+s\b", line) and COUNT.search(line)]
    if not lines:
        return {}
    found: dict[str, int] = {}
    for number, word in COUNT.findall(lines[-1]):
        key = "errors" if word.startswith("error") else word
        found[key] = found.get(key, 0) + int(number)
    return found


def slowest(report: Path, count: int = SLOWEST) -> list[tuple[float, str]]:
    """The ``count`` longest tests in a junit XML report, as (seconds, test id), longest first."""
    try:
        root = ET.parse(report).getroot()
    except (OSError, ET.ParseError):
        return []
    found = [(float(case.get("time") or 0), test_id(case.get("classname", ""), case.get("name", "")))
             for case in root.iter("testcase")]
    return sorted(found, reverse=True)[:count]


def failures(report: Path) -> list[tuple[str, str]]:
    """The tests that failed or errored in a junit XML report, as (test id, the first line of why)."""
    try:
        root = ET.parse(report).getroot()
    except (OSError, ET.ParseError):
        return []
    found = []
    for case in root.iter("testcase"):
        for kind in ("failure", "error"):
            for element in case.findall(kind):
                why = (element.get("message") or element.text or kind).strip().splitlines()
                found.append((test_id(case.get("classname", ""), case.get("name", "")), why[0][:300] if why else kind))
    return found


def test_id(classname: str, name: str) -> str:
    """pytest's id back from junit's dotted class name: ``tests/cli/test_watch.py::Class::name``."""
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        path = "/".join(parts[:cut]) + ".py"
        if (REPO / path).is_file():
            return "::".join([path, *parts[cut:], name])
    return f"{classname}::{name}"


def groups() -> list[tuple[str, list[str], dict[str, str], str | None]]:
    """Each group: name, pytest's selection, its environment, the testbed instance it runs in (None: this one)."""
    testbed, local = ["-m", "testbed"], ["-m", "not testbed"]
    if not split_testbed():
        return [("testbed", testbed, {}, None), ("local", local, {}, None)]
    return [("testbed", testbed, {"ORCH_TESTBED_SHARD": "a"}, None),
            ("local", local, {"ORCH_LOCAL_SHARD": "a"}, None), ("local-b", local, {"ORCH_LOCAL_SHARD": "b"}, None),
            ("testbed-b", testbed, {"ORCH_TESTBED_SHARD": "b"}, "b")]


def split_testbed() -> bool:
    from tests.testbed import lxc

    wanted = os.environ.get("ORCH_TESTBED_SPLIT", "1") != "0"
    return wanted and lxc.lxc_problem() is None and shutil.which("unshare") is not None


def ready_base() -> None:
    """The base images (the testbed's, the Slurm cluster's) and the torch site the CTs mount, built here if
    missing: the second testbed has no network to build them."""
    from tests.testbed import lxc, slurm, torchsite

    try:
        lxc.ensure_base()
        slurm.ensure_base()
        torchsite.ensure_site()
    except (lxc.TestbedError, OSError, subprocess.SubprocessError):
        pass  # each testbed group reports it


def compile_sources() -> None:
    """orch's and the tests' bytecode, written once here: with ``PYTHONDONTWRITEBYTECODE`` set (as many images
    do) each of the suite's thousands of orch processes would otherwise compile orch again."""
    import compileall

    for folder in ("orchestrator", "tests"):
        compileall.compile_dir(REPO / folder, quiet=2)


def main(argv: list[str]) -> int:
    from tests.testbed.instance import wrap

    compile_sources()

    scratch = tempfile.TemporaryDirectory(prefix="orch-groups-")
    shared = Path(scratch.name) / "claims"  # the files each group has taken (tests/claims.py)
    shared.mkdir()
    started = []
    for name, select, env, instance in groups():
        if instance is not None:
            ready_base()  # the other groups are running meanwhile
        log = tempfile.TemporaryFile()
        report = Path(scratch.name) / f"{name}.xml"
        command = [sys.executable, "-m", "pytest", "-q", f"--junitxml={report}", *select, *argv]
        inherited = {k: v for k, v in os.environ.items() if k not in SHARDS}  # a group's own, never its caller's
        proc = subprocess.Popen(wrap(instance, command) if instance else command, cwd=REPO, stdout=log,
                                stderr=subprocess.STDOUT, env=dict(inherited, ORCH_CLAIMS=str(shared), **env))
        started.append((name, proc, log, time.monotonic()))
    ended: dict[str, float] = {}
    while len(ended) < len(started):
        for name, proc, _log, _begin in started:
            if name not in ended and proc.poll() is not None:
                ended[name] = time.monotonic()
        time.sleep(0.5)
    results = []
    for name, proc, log, begin in started:
        code = proc.returncode
        took = ended[name] - begin
        log.seek(0)
        output = log.read().decode("utf-8", "replace")
        sys.stdout.write(f"\n===== {name} tests =====\n{output}")
        sys.stdout.flush()
        results.append((name, code, took, totals(output)))
    for name, *_ in started:
        listed = slowest(Path(scratch.name) / f"{name}.xml")
        if listed:
            print(f"\n===== {len(listed)} slowest {name} tests =====")
            for seconds, test in listed:
                print(f"{seconds:7.1f} s  {test}")
    for name, *_ in started:
        for test, why in failures(Path(scratch.name) / f"{name}.xml"):
            print(f"\n===== failed in {name}: {test}\n        {why}")
    scratch.cleanup()
    print("\n===== time per group =====")
    for name, code, took, counts in results:
        shown = ", ".join(f"{n} {k}" for k, n in counts.items()) or "no summary"
        print(f"{name:9} {took / 60:5.1f} min   {shown} (exit {code})")
    passed = sum(c.get("passed", 0) for *_, c in results)
    failed = sum(c.get("failed", 0) + c.get("errors", 0) for *_, c in results)
    skipped = sum(c.get("skipped", 0) for *_, c in results)
    ok = all(code in (0, NO_TESTS) for _n, code, *_ in results)
    if not ok and failed == 0:
        failed = 1  # a group that ended without a summary (killed, or could not start) failed
    print(f"{passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else ""))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
