"""The ddp example on this machine: two ranks under torchrun (gloo, CPU), in sync, then resumed.

torch is never a dependency of orch: it comes from the testbed's site folder (``torchsite``, the pinned CPU wheel,
installed there once and shared with the containers).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from orchestrator.batching import BatchSampler
from orchestrator.watch.metrics import Parser
from tests.testbed import torchsite

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ddp"
BATCHING = {"strategy": "megabatch", "token_budget": 2048, "max_seq_len": 128, "seed": 0}


def synthetic() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ddp_synthetic", EXAMPLE / "synthetic.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_rank_gets_as_many_batches_and_together_they_are_disjoint(world):
    data = synthetic()
    lengths, _, _ = data.make_data(400, 128)
    for make in (data.FallbackSampler, BatchSampler):
        samplers = [make(lengths, BATCHING, rank=r, world_size=world) for r in range(world)]
        for s in samplers:
            s.set_epoch(1)
        assert len({len(s) for s in samplers}) == 1 and len(samplers[0]) > 0
        seen = np.concatenate([b for s in samplers for b in s.batches()])
        assert len(seen) == len(set(seen.tolist())), make
        for s in samplers:
            assert all(int(lengths[b].max()) * len(b) <= BATCHING["token_budget"] for b in s.batches())


def test_the_fallback_sampler_follows_the_seed_and_the_epoch():
    data = synthetic()
    lengths, _, _ = data.make_data(400, 128)
    a, b = data.FallbackSampler(lengths, BATCHING), data.FallbackSampler(lengths, BATCHING)
    assert [x.tolist() for x in a.batches()] == [x.tolist() for x in b.batches()]
    b.set_epoch(1)
    assert [x.tolist() for x in a.batches()] != [x.tolist() for x in b.batches()]


def _torchrun(tmp: Path, steps: int) -> subprocess.CompletedProcess:
    batching = tmp / "batching.json"
    batching.write_text(json.dumps(BATCHING))
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(torchsite.SITE), "OMP_NUM_THREADS": "1",
           "ORCH_CHECKPOINT_DIR": str(tmp / "ckpt"), "ORCH_BATCHING_FILE": str(batching), "ORCH_EXPERIMENT_ID": "3",
           "DDP_STEPS": str(steps), "DDP_CKPT_EVERY": "3", "DDP_SAMPLES": "400"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc-per-node=2",
           str(EXAMPLE / "train.py")]
    return subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=150)


def test_two_ranks_train_in_sync_and_a_resume_continues_exactly(tmp_path):
    torchsite.ensure_site()
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    straight.mkdir()
    first = _torchrun(straight, 9)
    assert first.returncode == 0, first.stdout + first.stderr
    done = re.search(r"^done step=9 world=2 checksum=([0-9a-f]{16}) params in sync$", first.stdout, re.M)
    assert done, first.stdout
    steps = [e for e in Parser().parse_lines(first.stdout.splitlines()) if "loss" in e]
    assert [int(e["step"]) for e in steps] == list(range(1, 10))
    assert all(e["tok_s"] > 0 and e["tokens"] > 0 for e in steps)
    assert "not importable" not in first.stderr  # orch's BatchSampler, not the fallback
    assert sorted(p.name for p in (straight / "ckpt").iterdir()) == [f"ckpt-00000{i}.pt" for i in (3, 6, 9)]

    (resumed / "ckpt").mkdir(parents=True)  # a run cut after step 6: only its checkpoint is left
    shutil.copy(straight / "ckpt" / "ckpt-000006.pt", resumed / "ckpt")
    again = _torchrun(resumed, 9)
    assert again.returncode == 0, again.stdout + again.stderr
    assert re.search(r"^resumed from step=6 checkpoint=\S+ckpt-000006.pt \(rank 0\)$", again.stdout, re.M), \
        again.stdout
    later = [e for e in Parser().parse_lines(again.stdout.splitlines()) if "loss" in e]
    assert [int(e["step"]) for e in later] == [7, 8, 9]
    assert [e["tokens"] for e in later] == [e["tokens"] for e in steps[6:]]  # the count came back with the state
    final = re.search(r"^done step=9 world=2 checksum=([0-9a-f]{16}) params in sync$", again.stdout, re.M)
    assert final and final.group(1) == done.group(1), (again.stdout, done.group(1))  # bit for bit the same
