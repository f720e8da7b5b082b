"""Two public scripts' logs, end to end on the local target with no configuration: pytorch/examples
word_language_model/main.py and mnist/main.py, their lines printed with the scripts' own format strings by a real
run in tmux; status, experiments show (with no status in between), compare, plot and the MLflow export are the
real CLI, MLflow is read back with its own client.
"""

from __future__ import annotations

import json

import pytest

from mlflow import MlflowClient

from tests.cli.test_metric_formats import deploy, status_json
from tests.cli.test_mlflow_export import runs, store
from tests.mlflow_stores import empty_store
from tests.conftest import wait_for

# word_language_model/main.py's train() and its loop over epochs, on made-up numbers
WORD_LM = """\
import math, time
print("Using device: cpu", flush=True)
for epoch in range(1, 3):
    for batch in range(200, 801, 200):
        cur_loss = 8.0 - epoch - batch / 1000
        print('| epoch {:3d} | {:5d}/{:5d} batches | lr {:02.2f} | ms/batch {:5.2f} | '
              'loss {:5.2f} | ppl {:8.2f}'.format(epoch, batch, 2983, 20.0, 11.27, cur_loss, math.exp(cur_loss)),
              flush=True)
        time.sleep(0.05)
    val_loss = 6.0 - epoch
    print('-' * 89)
    print('| end of epoch {:3d} | time: {:5.2f}s | valid loss {:5.2f} | '
          'valid ppl {:8.2f}'.format(epoch, 35.12, val_loss, math.exp(val_loss)))
    print('-' * 89, flush=True)
print('=' * 89)
print('| End of training | test loss {:5.2f} | test ppl {:8.2f}'.format(3.9, math.exp(3.9)))
print('=' * 89, flush=True)
"""

# mnist/main.py's train() and test()
MNIST = """\
import time
for epoch in range(1, 3):
    for batch_idx in range(0, 938, 300):
        print('Train Epoch: {} [{}/{} ({:.0f}%)]\\tLoss: {:.6f}'.format(
            epoch, batch_idx * 64, 60000, 100. * batch_idx / 938, 2.3 / (epoch + batch_idx / 300)), flush=True)
        time.sleep(0.05)
    print('\\nTest set: Average loss: {:.4f}, Accuracy: {}/{} ({:.0f}%)\\n'.format(
        0.1 / epoch, 9800 + epoch, 10000, 98.0), flush=True)
"""


def ended(project, exp_id: int) -> None:
    wait_for(lambda: (project.run_dir(exp_id) / "exit.json").exists(), what="the run's end")


def show(project, exp_id: int) -> dict:
    res = project.cli("experiments", "show", str(exp_id), "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_word_language_model_end_to_end(project):
    exp_id, out = deploy(project, "main.py", WORD_LM, "--wait=30")
    assert "first metrics after" in out and "loss  6.80" in out  # --wait ended at the first metric line
    ended(project, exp_id)
    data = show(project, exp_id)  # no status ran since the run ended: show reads its log
    assert data["status"] == "finished" and "metrics_stale" not in data
    metrics = data["metrics"]
    assert metrics["loss"] == 5.2 and metrics["eval_loss"] == 4.0 and metrics["eval_metric"] == "val_loss"
    assert metrics["step"] == 2983 + 800  # epoch 2's batch 800, the counter restarting each epoch
    assert abs(metrics["median_steps_s"] - 1000 / 11.27) < 1e-9  # ms/batch
    assert {"lr": 20.0, "ppl": 181.27, "val_loss": 4.0, "val_ppl": 54.6, "test_loss": 3.9,
            "test_ppl": 49.4}.items() <= metrics["metrics"].items()
    assert "unrecognised_lines" not in metrics
    res = project.run("logs", "--metrics", "--json", "-e", str(exp_id), "-n", "1000")
    assert res.returncode == 0, res.stderr
    events = [json.loads(line) for line in res.stdout.splitlines()]
    assert events[0] == pytest.approx({"epoch": 1, "lr": 20.0, "loss": 6.8, "ppl": 897.85, "steps_s": 1000 / 11.27,
                                       "step": 200})
    assert {"epoch": 1, "val_loss": 5.0, "val_ppl": 148.41} in events and events[-1] == {"test_loss": 3.9,
                                                                                       "test_ppl": 49.4}
    summary = status_json(project)["summary"]
    assert summary["loss"] == 5.2 and summary["eval_loss"] == 4.0
    assert "val_loss=4" in project.cli("status").stdout

    other, _ = deploy(project, "main.py", WORD_LM.replace("6.0 - epoch", "6.5 - epoch"))
    ended(project, other)
    res = project.cli("experiments", "compare", str(exp_id), str(other), "--json")
    assert res.exit_code == 0, res.output
    rows = {r["metric"]: r["values"] for r in json.loads(res.stdout)["metrics"]}
    assert rows["final loss"] == ["5.2", "5.2"] and rows["final eval loss"] == ["4", "4.5"]
    assert rows["last val_loss"] == ["4", "4.5"] and rows["last test_ppl"] == ["49.4", "49.4"]
    assert list(rows).index("last ppl") < list(rows).index("last val_loss")  # training metrics, then evaluations'

    png = project.path / "val.png"
    res = project.cli("experiments", "plot", str(exp_id), str(other), "--metric", "val_loss", "--out", str(png))
    assert res.exit_code == 0, res.output
    assert png.read_bytes().startswith(b"\x89PNG")
    res = project.cli("experiments", "plot", str(exp_id), "--metric", "nosuch", "--out", str(png))
    assert res.exit_code != 0 and "has no nosuch series" in res.output

    empty_store(project.path / ".orch" / "mlflow.db")  # MLflow's own migrations are not this test's
    res = project.run("experiments", "export", "--mlflow", "-e", str(exp_id), "--no-log")
    assert res.returncode == 0, res.stderr
    run = runs(store(project))[exp_id]
    client = MlflowClient(store(project))
    history = {key: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
               for key in ("loss", "val_loss", "ppl", "lr", "test_loss")}
    assert sorted(history["val_loss"]) == [(800, 5.0), (2983 + 800, 4.0)]  # at the training step it followed
    assert len(history["loss"]) == 8 and history["lr"] and history["ppl"] and history["test_loss"]


def test_mnist_test_loss_is_not_the_training_loss(project):
    exp_id, out = deploy(project, "main.py", MNIST, "--wait=30")
    assert "first metrics after" in out
    ended(project, exp_id)
    metrics = show(project, exp_id)["metrics"]
    assert metrics["loss"] == round(2.3 / (2 + 900 / 300), 6)  # epoch 2's last training line
    assert metrics["eval_metric"] == "test_loss" and metrics["eval_loss"] == 0.05
    assert metrics["metrics"]["test_acc"] == 0.9802
    assert metrics["step"] == 60000 + 900 * 64  # samples: epoch 2's offset after epoch 1's 60000
    summary = status_json(project)["summary"]
    assert summary["loss"] == metrics["loss"] and summary["min_loss"] == metrics["loss"]
