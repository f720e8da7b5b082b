"""A run's own work folder on a real container (CT 200 over SSH): the revision stays byte for byte what was
pushed and read-only, the run's outputs and bytecode stay in its run folder, a restart attempt finds what the
first one wrote in its cwd, `exec` runs there, and `gc --keep 0` frees the revision once no run keeps it."""

from __future__ import annotations

import json

import pytest

from tests.cli.test_runfolder import SOURCES, _write
from tests.integration.test_remote import ROOT, on_ct, remote, wait_state  # noqa: F401  (the fixture)

pytestmark = pytest.mark.testbed

# run in the CT: every way the revision folder differs from its manifest, and what the run folder holds
INSPECT = """\
import hashlib, json, os, stat, sys
rev, run = sys.argv[1], sys.argv[2]
files = json.load(open(os.path.join(rev, ".orch-manifest.json")))["files"]
bad = []
present = set()
for base, dirs, names in os.walk(rev):
    if stat.S_IMODE(os.lstat(base).st_mode) != 0o555:
        bad.append("writable folder " + base)
    present |= {os.path.relpath(os.path.join(base, n), rev) for n in names}
if present != {f["path"] for f in files} | {".orch-manifest.json"}:
    bad.append("files %s" % sorted(present))
for f in files:
    p = os.path.join(rev, f["path"])
    if hashlib.sha256(open(p, "rb").read()).hexdigest() != f["sha256"]:
        bad.append("changed " + f["path"])
    if stat.S_IMODE(os.lstat(p).st_mode) != (0o555 if f["mode"] & 0o111 else 0o444):
        bad.append("mode of " + f["path"])
work = os.path.join(run, "work")
pyc = [n for n in os.listdir(os.path.join(work, "__pycache__")) if n.startswith("model.") and n.endswith(".pyc")]
seen = [json.loads(line) for line in open(os.path.join(work, "out", "seen.jsonl"))]
print(json.dumps({"bad": bad, "pyc": pyc, "seen": seen, "ckpt": open(os.path.join(work, "out", "ckpt.pt")).read(),
                  "cache": open(os.path.join(work, "data", "cache.bin")).read()}))
"""


def test_a_run_on_a_ct_writes_only_in_its_own_folder(remote, testbed):
    _write(remote)
    remote.write(sources=json.dumps(list(SOURCES)[:2] + ["config", "data"]))
    res = remote.cli("deploy", "--json", "--set", "run.restarts=1", "--set", "run.backoff=[0.2]")
    assert res.exit_code == 0, res.output
    exp = json.loads(res.stdout)["experiment"]
    wait_state(remote, [], ("finished",))
    run_dir = f"{ROOT}/runs/{remote.run_key(exp['id'])}"
    rev_dir = f"{ROOT}/revisions/{exp['revision']}"

    found = json.loads(on_ct(testbed, 200, "python3", "-c", INSPECT, rev_dir, run_dir))
    assert found["bad"] == []
    assert [s["resumed"] for s in found["seen"]] == [None, "attempt 0"] and found["ckpt"] == "attempt 1"
    assert {s["cwd"] for s in found["seen"]} == {f"{run_dir}/work"}
    assert found["seen"][0]["prefix"] is None and found["pyc"], found
    assert found["cache"] == "tokens cached"

    ls = remote.run("exec", "--", "ls")
    assert ls.returncode == 0, ls.stderr
    assert {"out", "train.py", "model.py", "config", "data"} <= set(ls.stdout.split())
    pwd = remote.run("exec", "--", "pwd")
    assert pwd.stdout.strip() == f"{run_dir}/work", pwd.stderr

    on_ct(testbed, 200, "find", f"{ROOT}/blobs", f"{ROOT}/revisions", "-exec", "touch", "-h", "-d", "2 hours ago",
          "{}", "+")
    kept = remote.cli("gc", "--keep", "1", "--dry-run")
    assert kept.exit_code == 0, kept.output
    assert f"revision {exp['revision']}: used by experiment {exp['id']} (finished)" in kept.stdout
    res = remote.cli("gc", "--keep", "0", "--yes", "--json")
    assert res.exit_code == 0, res.output
    assert {("revision", exp["revision"]), ("run", str(exp["id"]))} <= \
        {(i["kind"], i["name"]) for i in json.loads(res.stdout)["items"]}
    left = on_ct(testbed, 200, "ls", "-A", f"{ROOT}/revisions", f"{ROOT}/runs", f"{ROOT}/blobs").split()
    assert exp["revision"] not in left and remote.run_key(exp["id"]) not in left
