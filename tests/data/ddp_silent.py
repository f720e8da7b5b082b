"""A DDP job (gloo, CPU) whose node 0 prints a metric line each step and every other node prints nothing,
as the non-zero ranks of most training scripts do."""

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
loud = os.environ.get("ORCH_NODE_RANK") == "0"
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
steps, pause = int(os.environ.get("DDP_STEPS", "5")), float(os.environ.get("DDP_SLEEP", "0"))
for step in range(1, steps + 1):
    x = torch.randn(8, 4)
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if loud:
        print(f"step={step} loss={loss.item():.4f}", flush=True)
    time.sleep(pause)
dist.barrier()
if loud:
    print("done", flush=True)
dist.destroy_process_group()
