"""The tinylm example, run for real as a subprocess with tiny settings, read back with orch's metric parser."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from orchestrator.config import load_settings
from orchestrator.watch.metrics import Parser

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tinylm"
REPO = EXAMPLE.parents[1]
TOTALS = Parser({"real_tokens": r"real_tokens=(\d+)", "padded_tokens": r"padded_tokens=(\d+)"})


def run_tinylm(tmp: Path, *, strategy: str = "megabatch", wait: bool = True, **knobs: object):
    """Start train.py in ``tmp`` with 300 samples; returns the finished process (or the running one)."""
    batching = tmp / "batching.json"
    batching.write_text(json.dumps({"strategy": strategy, "token_budget": 2048, "max_seq_len": 256, "seed": 0}))
    env = {
        "PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
        "ORCH_EXPERIMENT_ID": "7", "ORCH_RUN_DIR": str(tmp), "ORCH_CHECKPOINT_DIR": str(tmp / "ckpt"),
        "ORCH_BATCHING_FILE": str(batching), "TINYLM_SAMPLES": "300", "TINYLM_LOG_EVERY": "5",
    }
    env |= {f"TINYLM_{k.upper()}": str(v) for k, v in knobs.items()}
    cmd = [sys.executable, str(EXAMPLE / "train.py")]
    if not wait:
        return subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.PIPE, text=True)
    return subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=120)


def checkpoints(tmp: Path) -> list[str]:
    return sorted(p.name for p in (tmp / "ckpt").iterdir())


def step_lines(stdout: str) -> dict[int, dict[str, float]]:
    """Logged steps -> their event, parsed exactly as ``orch`` parses a run's log."""
    events = Parser().parse_lines(line for line in stdout.splitlines() if line.startswith("step="))
    return {int(e["step"]): e for e in events}


def test_run_prints_parseable_metrics_and_writes_checkpoints(tmp_path: Path) -> None:
    done = run_tinylm(tmp_path, steps=40, ckpt_every=20)
    assert done.returncode == 0, done.stderr
    events = Parser().parse_lines(done.stdout.splitlines())
    assert {"total_steps": 40.0} in events
    steps = step_lines(done.stdout)
    assert sorted(steps) == [5, 10, 15, 20, 25, 30, 35, 40]
    for e in steps.values():
        assert set(e) == {"step", "loss", "tok_s", "epoch", "tokens"}
        assert e["tok_s"] > 0 and 0 < e["loss"] < 10
    assert steps[40]["loss"] < steps[5]["loss"]
    assert steps[40]["epoch"] >= 1
    assert checkpoints(tmp_path) == ["ckpt-000020.npz", "ckpt-000040.npz"]
    with np.load(tmp_path / "ckpt" / "ckpt-000040.npz") as ckpt:
        assert int(ckpt["step"]) == 40 and str(ckpt["experiment"]) == "7"
    result = json.loads((tmp_path / "tinylm-result.json").read_text())
    assert result["step"] == 40 and result["real_tokens"] == steps[40]["tokens"]


def test_crash_then_resume_continues_exactly(tmp_path: Path) -> None:
    crashed = run_tinylm(tmp_path, steps=40, ckpt_every=10, crash_at_step=27)
    assert crashed.returncode == 3
    assert "simulated crash at step=27" in crashed.stderr
    assert checkpoints(tmp_path) == ["ckpt-000010.npz", "ckpt-000020.npz"]

    resumed = run_tinylm(tmp_path, steps=40, ckpt_every=10)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.splitlines()[0].startswith("resumed from step=20 ")
    assert sorted(step_lines(resumed.stdout)) == [25, 30, 35, 40]

    straight = tmp_path / "straight"
    straight.mkdir()
    uninterrupted = run_tinylm(straight, steps=40, ckpt_every=10)
    assert step_lines(resumed.stdout)[40]["loss"] == step_lines(uninterrupted.stdout)[40]["loss"]
    assert step_lines(resumed.stdout)[40]["tokens"] == step_lines(uninterrupted.stdout)[40]["tokens"]


def test_finished_run_resumes_to_nothing(tmp_path: Path) -> None:
    assert run_tinylm(tmp_path, steps=10, ckpt_every=10).returncode == 0
    again = run_tinylm(tmp_path, steps=10, ckpt_every=10)
    assert again.returncode == 0
    assert "resumed from step=10 " in again.stdout and step_lines(again.stdout) == {}


def test_sigterm_saves_a_checkpoint(tmp_path: Path) -> None:
    proc = run_tinylm(tmp_path, steps=10_000, ckpt_every=10_000, sleep=0.02, wait=False)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("step="):
                break
        proc.send_signal(signal.SIGTERM)
        rest = proc.stdout.read()
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    saved = checkpoints(tmp_path)
    assert len(saved) == 1 and f"saved {saved[0]}" in rest


def test_shuffle_pads_more_than_sorted(tmp_path: Path) -> None:
    totals = {}
    for strategy in ("sorted", "shuffle"):
        workdir = tmp_path / strategy
        workdir.mkdir()
        done = run_tinylm(workdir, strategy=strategy, steps=30, ckpt_every=1000)
        assert done.returncode == 0, done.stderr
        last = TOTALS.parse_line(done.stdout.splitlines()[-1])
        assert last is not None
        totals[strategy] = last["padded_tokens"] / last["real_tokens"]
    assert totals["sorted"] < 1.15
    assert totals["shuffle"] > 1.5 * totals["sorted"]


def load_train_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tinylm_train", EXAMPLE / "train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("strategy", ["sorted", "shuffle"])
def test_fallback_packer_covers_every_sample_within_budget(strategy: str) -> None:
    train = load_train_module()
    lengths, _, _ = train.make_data(500, 256)
    config = {"strategy": strategy, "token_budget": 1024, "seed": 3}
    batches = train._fallback_batches(lengths, config, epoch=1)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(500))
    assert all(len(b) * lengths[b].max() <= 1024 for b in batches)
    again = train._fallback_batches(lengths, config, epoch=1)
    assert all(np.array_equal(a, b) for a, b in zip(batches, again))


def test_padding_is_computed_on() -> None:
    train = load_train_module()
    lengths, offsets, tokens = train.make_data(50, 64)
    idx = np.argsort(lengths)[[0, -1]]
    x, y, mask = train.padded_batch(idx, lengths, offsets, tokens)
    assert x.shape == y.shape == mask.shape == (2, int(lengths[idx].max()) - 1)
    assert mask.sum() == lengths[idx].sum() - 2
    first = tokens[offsets[idx[0]]:offsets[idx[0]] + lengths[idx[0]]]
    assert np.array_equal(x[0, :len(first) - 1], first[:-1]) and np.array_equal(y[0, :len(first) - 1], first[1:])


def test_example_config_loads() -> None:
    settings = load_settings(EXAMPLE / "orch.toml")
    assert settings.project.name == "tinylm" and settings.project.sources == ["train.py"]
    assert settings.default_target == "local" and settings.targets["local"].kind == "local"
    assert settings.batching.strategy == "megabatch" and settings.batching.max_seq_len == 512
