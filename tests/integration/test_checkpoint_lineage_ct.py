"""One checkpoint folder per experiment on a testbed CT (CT 200 over SSH): a sweep's variants write beside the
project's folder, an older orch's nested one is moved by the next launch, and a plain run that crashes at once is
restarted by the CT's supervisor from its own lineage's newest checkpoint; ``pull`` copies only the files the run wrote.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.cli.test_checkpoint_lineage import TRAIN
from tests.integration.test_remote import CKPT, ROOT, on_ct, remote  # noqa: F401  (the fixture)

pytestmark = pytest.mark.testbed

# an older orch's shape: experiment N's folder (and its trash) inside the lineage's, and its records naming it
NEST = """\
import json, os, sys
ck, run, n = sys.argv[1], sys.argv[2], sys.argv[3]
old = f"{ck}/exp{n}"
os.rename(f"{ck}@exp{n}", old)
os.makedirs(f"{old}.trash/20260101T000000Z-exp{n}")
open(f"{old}.trash/20260101T000000Z-exp{n}/old.bin", "w").write("trashed")
for name in ("experiment.json", "launch.json"):
    path = f"{run}/{name}"
    data = json.load(open(path))
    if name == "experiment.json":
        data["checkpoints"] = old
    else:
        data["env"]["ORCH_CHECKPOINT_DIR"] = old
    json.dump(data, open(path, "w"))
"""


def _log(remote, testbed, exp_id: int, what: str, timeout: float = 60) -> str:  # noqa: F811
    """Experiment ``exp_id``'s train.log in CT 200, once it holds ``what``."""
    log = f"{ROOT}/runs/{remote.run_key(exp_id)}/train.log"
    deadline = time.monotonic() + timeout
    while True:
        text = on_ct(testbed, 200, "sh", "-c", 'cat "$1" 2>/dev/null || true', "sh", log)
        if what in text:
            return text
        assert time.monotonic() < deadline, f"experiment {exp_id}'s log has no {what!r}: {text[-500:]!r}"
        time.sleep(0.3)


def _ls(testbed, folder: str) -> list[str]:
    return sorted(on_ct(testbed, 200, "sh", "-c", 'ls -A "$1" 2>/dev/null || true', "sh", folder).split())


def test_a_plain_run_after_a_sweep_resumes_from_its_lineage_on_a_ct(remote, testbed, tmp_path):  # noqa: F811
    (remote.path / "train.py").write_text(TRAIN)
    toml = remote.path / "orch.toml"
    toml.write_text(toml.read_text().replace("[run]\n", "[run]\nrestarts = 1\nbackoff = [0.1]\n"))
    assert remote.run("deploy", "--ct", "200").returncode == 0
    _log(remote, testbed, 1, "step=1 ")
    assert remote.run("stop", "--ct", "200").returncode == 0
    res = remote.run("sweep", "--ct", "200", "--set", "batching.strategy=sorted,shuffle", "--steps", "3")
    assert res.returncode == 0, res.stderr
    assert "the run will see them" not in res.stderr, res.stderr
    for exp_id in (2, 3):
        _log(remote, testbed, exp_id, "[orch] budget reached", timeout=90)
        assert _ls(testbed, f"{CKPT}@exp{exp_id}") == [f"ckpt-exp{exp_id}.bin"]
    assert _ls(testbed, CKPT) == ["ckpt-exp1.bin"]
    on_ct(testbed, 200, "python3", "-c", NEST, CKPT, f"{ROOT}/runs/{remote.run_key(2)}", "2")

    (remote.path / "train.py").write_text(TRAIN.replace("CRASH = False", "CRASH = True"))
    res = remote.run("deploy", "--ct", "200")
    assert res.returncode == 0, res.stderr
    assert "holds 1 file(s)" in res.stderr and "newest ckpt-exp1.bin, written by experiment 1" in res.stderr, \
        res.stderr
    log = _log(remote, testbed, 4, "attempt=1 ")
    assert f"attempt=1 resume={CKPT}/ckpt-exp1.bin ckpt={CKPT}" in log, log[-800:]
    assert _ls(testbed, f"{CKPT}@exp2") == ["ckpt-exp2.bin"]  # moved by that launch, with its trash
    assert _ls(testbed, f"{CKPT}@exp2.trash/20260101T000000Z-exp2") == ["old.bin"]
    assert "exp2" not in _ls(testbed, CKPT) and "exp2.trash" not in _ls(testbed, CKPT)
    with remote.registry() as reg:
        assert reg.get(2).checkpoints == f"{CKPT}@exp2"
    _log(remote, testbed, 4, "step=1 ")

    res = remote.run("pull", "--ct", "200", "-e", "4", "--checkpoints", "--to", str(tmp_path / "four"), "--json")
    assert res.returncode == 0, res.stderr
    # the file it resumed from is experiment 1's: left out, and named
    assert sorted(p.name for p in (tmp_path / "four" / "checkpoints").iterdir()) == ["ckpt-exp4.bin"]
    assert [(s["key"], s["why"]) for s in json.loads(res.stdout)["skipped"]] == [
        ("checkpoints/ckpt-exp1.bin", "written by experiment 1")]
    listed = json.loads(remote.run("checkpoints", "list", "--ct", "200", "--json").stdout)
    assert [(v["exp"], v["files"]) for v in listed["variants"]] == [(2, 1), (3, 1)]
    remote.run("stop", "--ct", "200", "--all")
