"""``experiments show`` and ``experiments compare`` as people read them, after real runs on the local target: each
metric once, rounded, with its best; nothing of how the log was read; how far each compared run got."""

from __future__ import annotations

import json
import re

from tests.cli.test_lifecycle import wait_status

# a Lightning-sized loss (0.000558-0.000636), evaluated twice, with an epoch and a token count on each line
SCRIPT = r'''import sys
steps = int(sys.argv[1])
for step in range(1, steps + 1):
    loss = 0.000636 if step == steps else 0.000558 + step * 1.234567e-7
    print(f"step={step} loss={loss:.9f} lr=0.000300000001 epoch={step // 10} tokens={step * 4096}", flush=True)
    if step % 10 == 0:
        print(f"step={step} val_loss={0.5 / step + 0.123456789:.9f}", flush=True)
'''


def configure(project, steps: int) -> None:
    (project.path / "fit.py").write_text(SCRIPT)
    text = (project.path / "orch.toml").read_text().replace('sources = ["train.py"]', 'sources = ["fit.py"]')
    command = f'command = "python3 fit.py {steps}"'
    (project.path / "orch.toml").write_text(re.sub(r'command = "python3 \w+\.py[ \d]*"', command, text, count=1))


def test_show_prints_each_metric_once_rounded_with_its_best_and_compare_says_each_runs_step_and_epoch(project):
    configure(project, 20)
    assert project.cli("deploy", "-m", "short", "--wait").exit_code == 0
    wait_status(project, 1, ("finished",))
    shown = project.run("experiments", "show", "1")
    assert shown.returncode == 0, shown.stderr
    lines = [line.split() for line in shown.stdout.splitlines() if line.strip().startswith("metric ")]
    names = [parts[1] for parts in lines]
    assert sorted(names) == ["loss", "lr", "val_loss"]  # once each: no summary key beside the same metric
    assert "eval_metric" not in shown.stdout and "min_loss" not in shown.stdout
    values = {parts[1]: parts[2] for parts in lines}
    assert values == {"loss": "0.000636", "lr": "0.0003", "val_loss": "0.1485"}  # four digits at most
    assert "metric loss         0.000636 (best 0.0005581, lowest)" in shown.stdout
    assert re.search(r"^  step +20$", shown.stdout, re.M)
    data = json.loads(project.run("experiments", "show", "1", "--json").stdout)
    assert data["metrics"]["best"]["loss"] == 0.000558123  # --json keeps every digit

    configure(project, 30)
    assert project.cli("deploy", "-m", "longer", "--clean-checkpoints", "--yes", "--wait").exit_code == 0
    wait_status(project, 2, ("finished",))
    compared = project.run("experiments", "compare", "1", "2", "--json")
    rows = {r["metric"]: r["values"] for r in json.loads(compared.stdout)["metrics"]}
    assert rows["step"] == ["20", "30"] and rows["epoch"] == ["2", "3"]
    text = project.run("experiments", "compare", "1", "2").stdout
    assert re.search(r"^\W*step\W+20\W+30\W*$", text, re.M), text
