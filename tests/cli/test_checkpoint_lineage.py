"""One checkpoint folder per experiment, none inside another's, on the local target (real tmux, agent, registry).

A sweep's variants and a ``--beside`` run write beside the project's folder (``<checkpoints>@exp<id>``); the
project's lineage (plain deploys, the supervisor's restarts) keeps the configured folder to itself: a plain run
that crashes at once resumes from the lineage's newest checkpoint, the deploy says who wrote it, ``pull`` copies
only the files the run wrote, and the sweep does not claim its variants see the project's files.
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
ckpt, exp = os.environ["ORCH_CHECKPOINT_DIR"], os.environ["ORCH_EXPERIMENT_ID"]
attempt = os.environ.get("ORCH_ATTEMPT", "0")
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
    # the file it resumed from is experiment 1's, not its own: left, and said
    assert os.listdir(tmp_path / "five" / "checkpoints") == ["ckpt-exp5.bin"]
    assert "skipped checkpoints/ckpt-exp1.bin: written by experiment 1" in res.stderr, res.stderr
    res = p.run("pull", "-e", "3", "--checkpoints", "--to", str(tmp_path / "three"))
    assert res.returncode == 0, res.stderr
    assert os.listdir(tmp_path / "three" / "checkpoints") == ["ckpt-exp3.bin"]

    listed = json.loads(p.run("checkpoints", "list", "--json").stdout)
    assert (listed["path"], listed["files"]) == (str(p.checkpoints), 2)
    assert [(v["exp"], v["path"], v["files"]) for v in listed["variants"]] == [
        (n, str(_own(p, n)), 1) for n in (2, 3, 4)]
    shown = p.run("checkpoints", "list").stdout
    assert f"experiment 3's own: {_own(p, 3)}: 1 file(s)" in shown, shown
    # an experiment's own folder is cleaned, listed and restored by -e; the lineage's clean leaves it alone
    assert p.run("stop", "-e", "5").returncode == 0
    res = p.run("checkpoints", "clean", "-e", "3", "--yes")
    assert res.returncode == 0, res.stderr
    trash = _own(p, 3).with_name(_own(p, 3).name + ".trash")
    [entry] = os.listdir(trash)
    assert entry.endswith("-exp3") and sorted(os.listdir(trash / entry)) == [".orch-trash.json", "ckpt-exp3.bin"]
    assert os.listdir(_own(p, 3)) == [] and sorted(os.listdir(p.checkpoints)) == ["ckpt-exp1.bin", "ckpt-exp5.bin"]
    mine = json.loads(p.run("checkpoints", "list", "-e", "3", "--json").stdout)
    assert (mine["path"], mine["files"], [e["name"] for e in mine["entries"]]) == (str(_own(p, 3)), 0, [entry])
    assert p.run("checkpoints", "restore", "-e", "3", entry).returncode == 0
    assert os.listdir(_own(p, 3)) == ["ckpt-exp3.bin"]
    res = p.run("checkpoints", "clean", "--yes")
    assert res.returncode == 0, res.stderr
    assert os.listdir(p.checkpoints) == [] and os.listdir(_own(p, 2)) == ["ckpt-exp2.bin"]
    assert os.listdir(_own(p, 3)) == ["ckpt-exp3.bin"] and os.listdir(_own(p, 4)) == ["ckpt-exp4.bin"]


def _files(folder: Path) -> dict[str, bytes]:
    return {str(f.relative_to(folder)): f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()}


def _nest(p, exp_id: int) -> dict[str, bytes]:
    """Experiment ``exp_id``'s own folder and trash put back in an older orch's shape: inside the lineage's folder,
    named so by its records on the target and its row here. What the folder and its trash hold."""
    old, own = p.checkpoints / f"exp{exp_id}", _own(p, exp_id)
    (own.with_name(own.name + ".trash") / "20260101T000000Z-exp9").mkdir(parents=True)
    (own.with_name(own.name + ".trash") / "20260101T000000Z-exp9" / "old.bin").write_text("trashed")
    (own / "sub").mkdir()
    (own / "sub" / "ckpt-0001.bin").write_text("nested")
    held = {**{f"{exp_id}/{k}": v for k, v in _files(own).items()},
            **{f"{exp_id}.trash/{k}": v for k, v in _files(own.with_name(own.name + ".trash")).items()}}
    os.rename(own, old)
    os.rename(own.with_name(own.name + ".trash"), old.with_name(old.name + ".trash"))
    run = p.run_dir(exp_id)
    for name, change in (("experiment.json", lambda d: {**d, "checkpoints": str(old)}),
                         ("launch.json", lambda d: {**d, "env": {**d["env"], "ORCH_CHECKPOINT_DIR": str(old)}})):
        (run / name).write_text(json.dumps(change(json.loads((run / name).read_text()))))
    with p.registry() as reg:
        reg.update(exp_id, checkpoints=str(old))
    return held


def test_the_next_launch_moves_an_older_orchs_nested_folders_with_every_file(lineage):
    p = lineage
    assert p.run("deploy", "--gpus", "1").returncode == 0
    wait_for(lambda: (p.checkpoints / "ckpt-exp1.bin").exists(), what="experiment 1's checkpoint")
    assert p.run("deploy", "--gpus", "1", "--beside").returncode == 0
    wait_for(lambda: (_own(p, 2) / "ckpt-exp2.bin").exists(), what="experiment 2's checkpoint")
    assert p.run("stop", "-e", "2").returncode == 0 and p.run("stop", "-e", "1").returncode == 0
    held = _nest(p, 2)
    assert sorted(os.listdir(p.checkpoints)) == ["ckpt-exp1.bin", "exp2", "exp2.trash"]
    listed = json.loads(p.run("checkpoints", "list", "--json").stdout)
    assert (listed["files"], listed["newest"]) == (1, "ckpt-exp1.bin")  # read before the move: passed over
    res = p.run("checkpoints", "list", "-e", "2")
    assert res.returncode == 2 and "where an older orch put them (inside the project's folder)" in res.stderr
    assert f"hint: the next launch on local moves them beside it ({_own(p, 2)})" in res.stderr, res.stderr

    res = p.run("deploy")
    assert res.returncode == 0, res.stderr
    assert "holds 1 file(s)" in res.stderr and "newest ckpt-exp1.bin, written by experiment 1" in res.stderr
    assert [a["resume"] for a in _lines(p, 3)] == [str(p.checkpoints / "ckpt-exp1.bin")]
    own = _own(p, 2)
    now = {**{f"2/{k}": v for k, v in _files(own).items()},
           **{f"2.trash/{k}": v for k, v in _files(own.with_name(own.name + ".trash")).items()}}
    assert now == held  # every file, byte for byte, where the new readers look
    assert not (p.checkpoints / "exp2").exists() and not (p.checkpoints / "exp2.trash").exists()
    run = p.run_dir(2)
    assert json.loads((run / "experiment.json").read_text())["checkpoints"] == str(own)
    assert json.loads((run / "launch.json").read_text())["env"]["ORCH_CHECKPOINT_DIR"] == str(own)
    with p.registry() as reg:
        assert reg.get(2).checkpoints == str(own)
    steps = [(e["event"], e.get("step")) for e in map(json.loads, (p.root / "checkpoint-moves.jsonl").open())]
    assert steps == [("begin", None), ("done", "folder"), ("done", "trash"), ("done", "records"), ("end", None)]
    listed = json.loads(p.run("checkpoints", "list", "--json").stdout)
    assert [(v["exp"], v["files"]) for v in listed["variants"]] == [(2, 2)]


def test_a_move_cut_short_is_finished_by_the_next_call(tmp_path):
    """The folder was renamed, the journal says so, the cut came before the trash and the records: the next
    ``ckpt_move`` finishes them, and moves nothing twice."""
    from orchestrator.agent.ckpt import ckpt_move
    from orchestrator.agent.layout import Layout

    layout = Layout(str(tmp_path / "root"))
    layout.ensure()
    ck = tmp_path / "ck"
    (ck / "exp7.trash" / "e").mkdir(parents=True)
    (ck / "exp7.trash" / "e" / "t.bin").write_text("t")
    (ck.with_name("ck@exp7")).mkdir()
    (ck.with_name("ck@exp7") / "w.bin").write_text("w")
    run = Path(layout.run_dir(7, "0123456789ab"))
    run.mkdir(parents=True)
    (run / "experiment.json").write_text(json.dumps({"project": "p", "checkpoints": str(ck / "exp7")}))
    (run / "launch.json").write_text(json.dumps({"env": {"ORCH_CHECKPOINT_DIR": str(ck / "exp7")}}))
    (run / "exit.json").write_text("{}")
    log = Path(layout.root) / ckpt_move.JOURNAL
    log.write_text(json.dumps({"event": "begin", "id": "1-exp7", "from": str(ck / "exp7"), "to": str(ck) + "@exp7"})
                   + "\n" + json.dumps({"event": "done", "id": "1-exp7", "step": "folder"}) + "\n")

    done = ckpt_move.move(layout, str(ck), str(ck))
    assert done["moved"] == [{"exp_id": 7, "registry": "0123456789ab", "from": str(ck / "exp7"),
                              "to": str(ck) + "@exp7"}] and done["left"] == []
    assert (tmp_path / "ck@exp7" / "w.bin").read_text() == "w"
    assert (tmp_path / "ck@exp7.trash" / "e" / "t.bin").read_text() == "t" and os.listdir(ck) == []
    assert json.loads((run / "experiment.json").read_text())["checkpoints"] == str(ck) + "@exp7"
    assert ckpt_move.move(layout, str(ck), str(ck)) == {"moved": [], "left": []}
    refused = ckpt_move.move(layout, "/etc", "/etc")  # never fails the launch it is part of: moves nothing
    assert refused["moved"] == [] and "system folder" in refused["skipped"]



def test_a_nested_folder_whose_run_waits_in_the_queue_stays_and_no_reader_of_the_lineage_sees_it(tmp_path):
    from orchestrator.agent.ckpt import checkpoints, ckpt_layout, ckpt_move
    from orchestrator.agent.run import attempts
    from orchestrator.agent.layout import Layout

    layout = Layout(str(tmp_path / "root"))
    layout.ensure()
    ck = tmp_path / "ck"
    (ck / "exp8").mkdir(parents=True)
    (ck / "exp8" / "w.bin").write_text("variant")
    (ck / "exp9").mkdir()  # the lineage's own folder of that name: no record names it
    (ck / "exp9" / "mine.bin").write_text("lineage")
    (ck / "ckpt-1.bin").write_text("lineage")
    os.utime(ck / "ckpt-1.bin", (1, 1))
    os.utime(ck / "exp9", (2, 2))
    os.utime(ck / "exp8", (3, 3))  # the variant's folder is the newest entry
    queue = Path(layout.root) / "queue" / "p"
    queue.mkdir(parents=True)
    (queue / "1-0123456789ab-8.json").write_text(json.dumps({"experiment": {"checkpoints": str(ck / "exp8")}}))

    assert ckpt_move.move(layout, str(ck), str(ck)) == {"moved": [], "left": [{"from": str(ck / "exp8"),
                                                                              "why": "queued"}]}
    assert (ck / "exp8" / "w.bin").read_text() == "variant"
    inv = checkpoints.inventory(layout, str(ck), str(ck))
    assert sorted(f["path"] for f in inv["listing"]) == ["ckpt-1.bin", "exp9/mine.bin"]
    skip = ckpt_layout.legacy_names(layout, str(ck))
    assert skip == {"exp8"} and attempts.newest_checkpoint(str(ck), None, skip) == str(ck / "exp9")
    moved = checkpoints.move_to_trash(layout, str(ck), str(ck), label="exp1")
    assert moved["moved"] == 2 and sorted(os.listdir(ck)) == ["exp8"]
