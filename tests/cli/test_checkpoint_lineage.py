"""One checkpoint folder per experiment, none inside another's, on the local target (real tmux, agent, registry).

A sweep's variants and a ``--beside`` run write beside the project's folder (``<checkpoints>@exp<id>``); the
project's lineage (plain deploys, the supervisor's restarts) keeps the configured folder to itself: a plain run
that crashes at once resumes from the lineage's newest checkpoint, the deploy says who wrote it, ``pull`` copies
only the run's own, and the sweep does not claim its variants see the project's files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import wait_for

TRAIN = """\
import os, signal, sys, time
CRASH = False
ckpt, exp, attempt = os.environ["ORCH_CHECKPOINT_DIR"], os.environ["ORCH_EXPERIMENT_ID"], os.environ.get("ORCH_ATTEMPT", "0")
print(f"attempt={attempt} resume={os.environ.get('ORCH_RESUME_FROM', '')} ckpt={ckpt}", flush=True)
if CRASH and attempt == "0":
    sys.exit(3)
os.makedirs(ckpt, exist_ok=True)
with open(os.path.join(ckpt, f"ckpt-exp{exp}.bin"), "w") as fh:
    fh.write(f"weights of {exp}")
signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
step = 0
while True:
    step += 1
    print(f"step={step} loss=1.0", flush=True)
    time.sleep(0.1)
"""


@pytest.fixture
def lineage(project):
    (project.path / "train.py").write_text(TRAIN)
    project.configure(extra="gpus = 2\n")
    toml = project.path / "orch.toml"
    toml.write_text(toml.read_text().replace("[run]\n", "[run]\nrestarts = 1\nbackoff = [0.1]\n"))
    yield project
    project.run("stop", "--all")


def _lines(project, exp_id: int, n: int = 1) -> list[dict]:
    """The first ``n`` attempt lines experiment ``exp_id``'s script printed."""
    log = project.run_dir(exp_id) / "train.log"
    found = wait_for(lambda: (lambda ls: ls if len(ls) >= n else None)(
        [ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith("attempt=")]
        if log.exists() else []), what=f"experiment {exp_id}'s attempt lines")
    return [dict(part.split("=", 1) for part in ln.split()) for ln in found]


def _own(project, exp_id: int) -> Path:
    return project.checkpoints.with_name(f"{project.checkpoints.name}@exp{exp_id}")


def test_a_plain_run_after_a_sweep_and_a_beside_run_resumes_from_its_own_lineage(lineage, tmp_path):
    p = lineage
    assert p.run("deploy", "--gpus", "1").returncode == 0
    wait_for(lambda: (p.checkpoints / "ckpt-exp1.bin").exists(), what="experiment 1's checkpoint")

    res = p.run("deploy", "--gpus", "1", "--beside")  # beside experiment 1
    assert res.returncode == 0, res.stderr
    wait_for(lambda: (_own(p, 2) / "ckpt-exp2.bin").exists(), what="experiment 2's checkpoint")
    assert p.run("stop", "-e", "2").returncode == 0 and p.run("stop", "-e", "1").returncode == 0

    res = p.run("sweep", "--set", "batching.strategy=sorted,shuffle", "--steps", "3")
    assert res.returncode == 0, res.stderr
    assert "the run will see them" not in res.stderr, res.stderr  # the variants see none of the lineage's files
    wait_for(lambda: (p.run_dir(4) / "exit.json").exists(), timeout=60, what="the sweep's last variant's end")
    for exp_id in (2, 3, 4):
        assert _lines(p, exp_id)[0]["ckpt"] == str(_own(p, exp_id))
        assert sorted(os.listdir(_own(p, exp_id))) == [f"ckpt-exp{exp_id}.bin"]
    assert sorted(os.listdir(p.checkpoints)) == ["ckpt-exp1.bin"]  # nothing of theirs in the lineage's folder

    # a plain run that crashes at once: its supervisor restarts it from the lineage's newest checkpoint
    (p.path / "train.py").write_text(TRAIN.replace("CRASH = False", "CRASH = True"))
    res = p.run("deploy")
    assert res.returncode == 0, res.stderr
    assert f"checkpoints: {p.checkpoints} holds 1 file(s)" in res.stderr, res.stderr
    assert "(newest ckpt-exp1.bin, written by experiment 1); the run will see them" in res.stderr, res.stderr
    newest = str(p.checkpoints / "ckpt-exp1.bin")  # not a variant's folder, nor anything in one
    assert [(a["attempt"], a["resume"]) for a in _lines(p, 5, 2)] == [("0", newest), ("1", newest)]
    wait_for(lambda: (p.checkpoints / "ckpt-exp5.bin").exists(), what="experiment 5's checkpoint")

    res = p.run("pull", "-e", "5", "--checkpoints", "--to", str(tmp_path / "five"))
    assert res.returncode == 0, res.stderr
    assert sorted(os.listdir(tmp_path / "five" / "checkpoints")) == ["ckpt-exp1.bin", "ckpt-exp5.bin"]
    res = p.run("pull", "-e", "3", "--checkpoints", "--to", str(tmp_path / "three"))
    assert res.returncode == 0, res.stderr
    assert os.listdir(tmp_path / "three" / "checkpoints") == ["ckpt-exp3.bin"]

    listed = json.loads(p.run("checkpoints", "list", "--json").stdout)
    assert (listed["path"], listed["files"]) == (str(p.checkpoints), 2)
    assert [(v["exp"], v["path"], v["files"]) for v in listed["variants"]] == [
        (n, str(_own(p, n)), 1) for n in (2, 3, 4)]
    shown = p.run("checkpoints", "list").stdout
    assert f"experiment 3's own: {_own(p, 3)}: 1 file(s)" in shown, shown
