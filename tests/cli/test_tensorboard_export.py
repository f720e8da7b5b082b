"""`orch experiments export --tensorboard DIR`, through the real CLI, read back with TensorBoard's own
`EventAccumulator` (what `tensorboard --logdir DIR` loads)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import snapshot, wait_for

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # the tensorboard extra

# prints a training line each step and an evaluation's every 10 steps (TINYLM_* from the project's orch.toml)
TRAIN = """import os, time
steps, sleep = int(os.environ["TINYLM_STEPS"]), float(os.environ["TINYLM_SLEEP"])
for step in range(1, steps + 1):
    print(f"step={step} loss={2.0 / step:.4f} lr=0.001", flush=True)
    if step % 10 == 0:
        print(f"eval: loss={1.0 / step:.4f} acc={step / (step + 1):.4f}", flush=True)
    time.sleep(sleep)
"""


@pytest.fixture
def board(project, tmp_path):
    (project.path / "train.py").write_text(TRAIN)
    return tmp_path / "tb"


def scalars(folder: Path) -> dict[str, list]:
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: acc.Scalars(tag) for tag in acc.Tags()["scalars"]}


def series_saved(run: Path) -> None:
    """Waits for the run's supervisor's last read of its log (deploy --wait may answer just before it)."""
    def saved() -> bool:
        state = json.loads((run / "metrics.state.json").read_text()) if (run / "metrics.state.json").exists() else {}
        return (run / "exit.json").exists() and state.get("log") == (run / "train.log").stat().st_size

    wait_for(saved, timeout=30, what="the series' last save")


def export(project, *args: str) -> dict:
    res = project.run("experiments", "export", *args, "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_export_reads_back_in_tensorboard_train_and_eval_apart_and_again_adds_nothing(project, board):
    project.configure(sleep=0.02)  # its lines over several of its supervisor's reads (0.2 s apart)
    assert project.run("deploy", "--wait", "-m", "first").returncode == 0
    series_saved(project.run_dir(1))
    res = project.run("experiments", "export", "--tensorboard", str(board))
    assert res.returncode == 0, res.stderr
    assert "experiment 1: TensorBoard run exp-1 (" in res.stdout
    assert f"tensorboard --logdir {board}" in res.stdout
    with project.registry() as reg:
        started, ended = reg.get(1).started, reg.get(1).ended
    found = scalars(board / "exp-1")
    assert set(found) == {"train/loss", "train/lr", "eval/val_loss", "eval/val_acc"}
    loss = found["train/loss"]
    assert [e.step for e in loss] == list(range(1, 41))  # the steps the log printed
    assert [e.value for e in loss] == pytest.approx([round(2.0 / s, 4) for s in range(1, 41)], rel=1e-6)
    val = found["eval/val_loss"]  # an evaluation at the training step it came after, never in train/loss
    assert [(e.step, e.value) for e in val] == [(s, pytest.approx(round(1.0 / s, 4), rel=1e-6)) for s in (10, 20, 30, 40)]
    # each point's wall time is when the run's supervisor read its line (its series), not the experiment's end
    walls = [e.wall_time for e in loss]
    assert walls == sorted(walls) and walls[0] < walls[-1] <= ended + 1 and walls[0] >= started - 1
    assert [e.wall_time for e in val] == [walls[s - 1] for s in (10, 20, 30, 40)]

    files = snapshot(board)
    again = export(project, "--tensorboard", str(board))
    assert again["runs"] == [{"experiment": 1, "run": "exp-1", "points": 0, "tags": []}]
    assert snapshot(board) == files  # nothing new: no event file written

    assert project.run("restart", "--wait", "--clean-checkpoints", "--yes", "-m", "second").returncode == 0
    series_saved(project.run_dir(2))  # --wait answers at the first metric line: the run's 40 steps are read by now
    both = export(project, "--tensorboard", str(board))
    assert [(r["experiment"], r["points"] > 0) for r in both["runs"]] == [(1, False), (2, True)]
    assert [e.step for e in scalars(board / "exp-2")["train/loss"]] == list(range(1, 41))


def test_a_running_experiment_exported_again_gets_only_its_new_points(project, board):
    project.configure(steps=100000, sleep=0.02)
    assert project.run("deploy", "-m", "long").returncode == 0
    wait_for(lambda: "step=30 " in (project.run_dir(1) / "train.log").read_text(), timeout=60, what="step 30")
    first = export(project, "--tensorboard", str(board), "-e", "1")["runs"][0]
    before = scalars(board / "exp-1")
    assert first["points"] == sum(len(v) for v in before.values()) and before["eval/val_loss"]
    assert project.run("stop").returncode == 0
    second = export(project, "--tensorboard", str(board), "-e", "1")["runs"][0]
    after = scalars(board / "exp-1")
    assert second["points"] == sum(len(v) for v in after.values()) - first["points"] > 0
    for tag, events in after.items():
        steps = [e.step for e in events]
        assert len(steps) == len(set(steps)), f"{tag}: a step exported twice"
        kept = [(e.step, e.value) for e in before.get(tag, [])]
        assert [(e.step, e.value) for e in events][:len(kept)] == kept  # the first export's points, as they were
    assert max(e.step for e in after["train/loss"]) > max(e.step for e in before["train/loss"])
    assert len(list((board / "exp-1").glob("events.out.tfevents.*"))) == 2  # the new points in a file of their own


def test_a_run_read_with_metrics_patterns_is_exported_from_the_registry_at_one_time(project, board):
    # [metrics] patterns need the log's lines, not the supervisor's series: the registry's points, with the end time
    project.configure(sleep=0.02, extra='\n[metrics]\npatterns = { lr_x = "lr=([0-9.]+)" }\n')
    assert project.run("deploy", "--wait").returncode == 0
    assert export(project, "--tensorboard", str(board))["runs"][0]["points"] > 0
    found = scalars(board / "exp-1")
    assert found["train/lr_x"] and found["train/loss"]
    assert len({e.wall_time for e in found["train/loss"]}) == 1  # no time per point: the end's (or the export's)


def test_without_the_tensorboard_extra_an_error_names_it_and_nothing_is_written(project, board, tmp_path):
    assert project.run("deploy", "--wait").returncode == 0
    # a tensorboard that cannot be imported, first on the path, as where the extra is not installed
    shadow = tmp_path / "shadow" / "tensorboard"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named tensorboard')\n")
    res = project.run("experiments", "export", "--tensorboard", str(board),
                      env={"PYTHONPATH": f"{shadow.parent}:{Path(__file__).resolve().parents[2]}"})
    assert res.returncode != 0
    assert "error: exporting to TensorBoard needs the tensorboard library" in res.stderr
    assert "hint: install orch's tensorboard extra" in res.stderr and "[tensorboard]" in res.stderr
    assert not board.exists()


def test_a_file_for_the_folder_or_no_destination_is_an_error(project, board):
    board.write_text("not a folder")
    res = project.run("experiments", "export", "--tensorboard", str(board))
    assert res.returncode != 0 and f"error: {board} is a file, not a folder" in res.stderr
    assert board.read_text() == "not a folder"
    res = project.run("experiments", "export")
    assert res.returncode != 0 and "--tensorboard DIR" in res.stderr
