"""A tiny DistributedDataParallel job (gloo, CPU): a few steps, then checks every rank holds the same weights.
With ``DDP_CKPT_EVERY`` set, rank 0 writes a checkpoint of the weights every that many steps (beside, then renamed)."""

import os
import time
import uuid
from datetime import timedelta

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
steps, pause = int(os.environ.get("DDP_STEPS", "5")), float(os.environ.get("DDP_SLEEP", "0"))
ckpt_every, token = int(os.environ.get("DDP_CKPT_EVERY", "0")), uuid.uuid4().hex[:10]
for step in range(1, steps + 1):
    gen = torch.Generator().manual_seed(1000 * step + rank)  # each rank its own batch
    x = torch.randn(8, 4, generator=gen)
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step={step} loss={loss.item():.4f} rank={rank} world={world} node={os.environ.get('ORCH_NODE_RANK')}",
          flush=True)
    if ckpt_every and rank == 0 and step % ckpt_every == 0:
        folder = os.environ["ORCH_CHECKPOINT_DIR"]
        os.makedirs(folder, exist_ok=True)
        part = os.path.join(folder, f".ckpt-{token}.part")
        torch.save(model.state_dict(), part)
        os.replace(part, os.path.join(folder, f"ckpt-{token}-{step:05d}.pt"))
    time.sleep(pause)
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
every = [torch.zeros_like(flat) for _ in range(world)]
dist.all_gather(every, flat)
print("params in sync" if all(torch.equal(e, every[0]) for e in every) else "params DIFFER", flush=True)
dist.destroy_process_group()
