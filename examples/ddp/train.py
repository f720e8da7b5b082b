"""ddp: a small GRU language model trained with DistributedDataParallel across nodes (torchrun).

Every rank builds the same synthetic samples from a seed and trains on its own share of the batches
(``orchestrator.batching.BatchSampler`` with its rank and world size; see synthetic.py). gloo on CPU, nccl when
CUDA is there. Started by ``orch deploy --ct 200 --ct 201`` (torchrun on each node), or alone:
``python3 -m torch.distributed.run --standalone --nproc-per-node=2 train.py``, or ``python3 train.py``.

Environment (all optional):
    RANK, WORLD_SIZE, LOCAL_RANK  set by torchrun (without them: one process, rank 0 of 1)
    ORCH_CHECKPOINT_DIR  this node's checkpoint folder (default ``./checkpoints``); rank 0 writes there
    ORCH_RESUME_FROM     a checkpoint to resume from (orch's restarts set it); default: the newest one
    ORCH_BATCHING_FILE   JSON of the ``[batching]`` table;  ORCH_EXPERIMENT_ID  stored in checkpoints
    DDP_STEPS, DDP_CKPT_EVERY, DDP_LOG_EVERY, DDP_SAMPLES, DDP_SLEEP, DDP_TIMEOUT (flags win)

Resume: the checkpoint folder is per node (only rank 0's node has one unless it is shared), so each node
looks in its own, the ranks agree on the newest step found anywhere, and the rank holding it loads it and
broadcasts step and state to all (``dist.broadcast_object_list``).

Output on each node's first process, one line per logged step (orch's metric parser reads it; loss and
tok/s are over all ranks)::

    step=12 loss=3.2141 tok/s=15234 epoch=0 tokens=51234
    done step=200 world=2 checksum=5f1c0e8a9b2d4c61 params in sync
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import re
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import synthetic as data

CKPT_NAME = re.compile(r"^ckpt-(\d+)\.pt$")


class GruLM(nn.Module):
    """Embedding -> GRU -> logits over the vocabulary."""

    def __init__(self, vocab: int = data.VOCAB, embed: int = 32, hidden: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.gru = nn.GRU(embed, hidden, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(self.embed(x))
        return self.head(out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    env = os.environ.get
    ap = argparse.ArgumentParser(description="Train the ddp example (knobs also read from DDP_* variables).")
    ap.add_argument("--steps", type=int, default=env("DDP_STEPS") or "200")
    ap.add_argument("--ckpt-every", type=int, default=env("DDP_CKPT_EVERY") or "50")
    ap.add_argument("--log-every", type=int, default=env("DDP_LOG_EVERY") or "1")
    ap.add_argument("--samples", type=int, default=env("DDP_SAMPLES") or "2000")
    ap.add_argument("--sleep", type=float, default=env("DDP_SLEEP") or "0")
    ap.add_argument("--timeout", type=float, default=env("DDP_TIMEOUT") or "60",
                    help="seconds a collective waits for a silent peer (torch's default is 30 min)")
    return ap.parse_args(argv)


def init_distributed(timeout: float) -> tuple[int, int, int, torch.device]:
    """Join the process group torchrun describes (or a group of one); returns rank, world, local rank, device."""
    if "RANK" not in os.environ:  # run alone: a group of one on a local store
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
    return dist.get_rank(), dist.get_world_size(), local, device


def save_checkpoint(directory: Path, state: dict) -> Path:
    """``ckpt-<step>.pt`` written atomically: a temp file beside it, fsync, rename."""
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"ckpt-{state['step']:06d}.pt"
    tmp = directory / f".{final.name}.tmp"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    return final


def local_checkpoint(directory: Path) -> Path | None:
    """``ORCH_RESUME_FROM`` when it names a checkpoint here, else the newest ``ckpt-*.pt`` of ``directory``."""
    given = os.environ.get("ORCH_RESUME_FROM")
    if given and CKPT_NAME.match(Path(given).name) and Path(given).is_file():
        return Path(given)
    found = [(int(m.group(1)), p) for p in directory.glob("ckpt-*.pt") if (m := CKPT_NAME.match(p.name))]
    return max(found)[1] if found else None


def agree_on_resume(directory: Path, rank: int, world: int, local: int) -> tuple[dict | None, str]:
    """The newest checkpoint any node holds, loaded by the rank that has it and broadcast to every rank."""
    mine = local_checkpoint(directory) if local == 0 else None
    step = int(CKPT_NAME.match(mine.name).group(1)) if mine else -1  # type: ignore[union-attr]
    steps: list = [None] * world
    dist.all_gather_object(steps, (step, str(mine or "")))
    best = max(s for s, _ in steps)
    if best < 0:
        return None, ""
    src = next(r for r, (s, _) in enumerate(steps) if s == best)
    box = [torch.load(mine, map_location="cpu", weights_only=True) if rank == src else None]
    dist.broadcast_object_list(box, src=src)
    return box[0], f"{steps[src][1]} (rank {src})"


def checksum(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def train(args: argparse.Namespace) -> int:
    rank, world, local, device = init_distributed(args.timeout)
    talk = local == 0  # one log line per node, not per process
    ckpt_dir = Path(os.environ.get("ORCH_CHECKPOINT_DIR") or "checkpoints")
    config = data.read_batching(os.environ.get("ORCH_BATCHING_FILE"))
    lengths, offsets, tokens = data.make_data(args.samples, int(config["max_seq_len"]))
    sampler = data.make_sampler(lengths, config, rank=rank, world_size=world, quiet=not talk)

    torch.manual_seed(0)  # the same initial weights everywhere (DDP also broadcasts rank 0's)
    model = GruLM().to(device)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[local] if device.type == "cuda" else None)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    step, seen = 0, 0
    state, where = agree_on_resume(ckpt_dir, rank, world, local)
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step, seen = int(state["step"]), int(state["tokens"])
        if talk:
            print(f"resumed from step={step} checkpoint={where}", flush=True)
    if talk:
        print(f"experiment={os.environ.get('ORCH_EXPERIMENT_ID') or '-'} rank={rank} world={world} "
              f"backend={dist.get_backend()} strategy={config['strategy']} batches/epoch={len(sampler)}", flush=True)
        print(f"total_steps={args.steps}", flush=True)

    per_epoch = len(sampler)
    if per_epoch == 0:
        raise SystemExit(f"no batches for {world} ranks: raise DDP_SAMPLES or lower the token budget")
    window = torch.zeros(2, dtype=torch.float64, device=device)  # loss x tokens, tokens: since the last line
    started = time.perf_counter()
    while step < args.steps:
        epoch, position = divmod(step, per_epoch)
        sampler.set_epoch(epoch)
        x, y, mask = (torch.from_numpy(a).to(device) for a in data.padded(sampler.batches()[position],
                                                                        lengths, offsets, tokens))
        logits = ddp(x)
        count = mask.sum()
        per_token = nn.functional.cross_entropy(logits.transpose(1, 2), y, reduction="none")
        loss = (per_token * mask).sum() / count.clamp(min=1)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        stats = torch.stack([loss.detach().double() * count, count.double()])
        dist.all_reduce(stats)  # this step's loss x tokens and tokens over all ranks: the logged figures are global
        window += stats
        seen += int(stats[1].item())
        if args.sleep:
            time.sleep(args.sleep)
        if step % args.log_every == 0 or step == args.steps:
            now = time.perf_counter()
            if talk:
                print(f"step={step} loss={window[0].item() / max(window[1].item(), 1):.4f} "
                      f"tok/s={window[1].item() / max(now - started, 1e-9):.0f} epoch={epoch} tokens={seen}",
                      flush=True)
            window.zero_()
            started = now
        if rank == 0 and (step % args.ckpt_every == 0 or step == args.steps):
            save_checkpoint(ckpt_dir, {"step": step, "tokens": seen, "world": world,
                                       "experiment": os.environ.get("ORCH_EXPERIMENT_ID", ""),
                                       "model": model.state_dict(), "optimizer": opt.state_dict()})

    mine = checksum(model)
    every: list = [None] * world
    dist.all_gather_object(every, mine)
    same = all(c == every[0] for c in every)
    if talk:
        print(f"done step={step} world={world} checksum={mine} " + ("params in sync" if same else
              f"params DIFFER: {' '.join(every)}"), flush=True)
    # DDP's reducer holds work and buckets of the group: released while the interpreter is whole, not as it tears
    # down (gloo's threads then abort the process: "terminate called without an active exception")
    del ddp
    gc.collect()
    dist.barrier()  # every rank done with the group before any tears it down (gloo's threads abort otherwise)
    dist.destroy_process_group()
    return 0 if same else 1


def main(argv: list[str] | None = None) -> int:
    return train(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
