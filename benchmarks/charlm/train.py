"""A small GPT-style character model, trained the way public training scripts are: a config file and
``--key=value`` overrides, data read from ``train.bin``/``val.bin`` by memory map, a log line per iteration
(``iter N: loss L, time T ms, tok/s S``), an evaluation every ``eval_interval`` steps (``step N: train loss A, val
loss B``) and a checkpoint written by rename after each evaluation, resumed from when ``ORCH_RESUME_FROM`` or
``--init_from=resume`` says so. It exercises what orch does with such a script (its sources, its data, its log
format, its checkpoints) with code of this project's own.

    python train.py config/cpu.py --max_iters=200 --device=cpu
"""

from __future__ import annotations

import math
import os
import pickle
import sys
import time

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F

config = dict(
    out_dir="out", data_dir="data/chars", device="cpu", seed=1337, init_from="scratch",
    batch_size=12, block_size=64, n_layer=4, n_head=4, n_embd=128, dropout=0.0,
    learning_rate=1e-3, min_lr=1e-4, warmup_iters=50, lr_decay_iters=2000, max_iters=2000, weight_decay=0.1,
    grad_clip=1.0, eval_interval=250, eval_iters=20, log_interval=1,
)


def read_config(argv: list[str]) -> None:
    """A file of ``name = value`` lines first, then ``--name=value`` flags, each checked against the defaults."""
    for arg in argv:
        if arg.startswith("--"):
            name, _, raw = arg[2:].partition("=")
            if name not in config:
                sys.exit(f"unknown setting --{name}; known: {', '.join(sorted(config))}")
            kind = type(config[name])
            config[name] = (raw.lower() in ("1", "true", "yes")) if kind is bool else kind(raw)
        else:
            values: dict = {}
            exec(open(arg).read(), {}, values)  # a config file is Python assignments, as users write them
            unknown = set(values) - set(config)
            if unknown:
                sys.exit(f"{arg}: unknown setting(s) {', '.join(sorted(unknown))}")
            config.update(values)


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.attn = nn.MultiheadAttention(n_embd, n_head, dropout=dropout, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd),
                                 nn.Dropout(dropout))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class CharGPT(nn.Module):
    def __init__(self, vocab: int, block: int, n_layer: int, n_head: int, n_embd: int, dropout: float):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, n_embd), nn.Embedding(block, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout) for _ in range(n_layer))
        self.norm, self.head = nn.LayerNorm(n_embd), nn.Linear(n_embd, vocab, bias=False)
        self.register_buffer("mask", torch.triu(torch.ones(block, block, dtype=torch.bool), diagonal=1))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tokens(idx) + self.positions(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x, self.mask[:t, :t])
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def batch(split: str, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    data = np.memmap(os.path.join(config["data_dir"], f"{split}.bin"), dtype=np.uint16, mode="r")
    starts = rng.integers(0, len(data) - config["block_size"] - 1, config["batch_size"])
    x = np.stack([data[s:s + config["block_size"]] for s in starts]).astype(np.int64)
    y = np.stack([data[s + 1:s + 1 + config["block_size"]] for s in starts]).astype(np.int64)
    return torch.from_numpy(x).to(config["device"]), torch.from_numpy(y).to(config["device"])


def learning_rate(it: int) -> float:
    if it < config["warmup_iters"]:
        return config["learning_rate"] * (it + 1) / config["warmup_iters"]
    progress = min(1.0, (it - config["warmup_iters"]) / max(1, config["lr_decay_iters"] - config["warmup_iters"]))
    return config["min_lr"] + 0.5 * (1 + math.cos(math.pi * progress)) * (config["learning_rate"] - config["min_lr"])


@torch.no_grad()
def evaluate(model: CharGPT, rng: np.random.Generator) -> dict[str, float]:
    model.eval()
    losses = {split: float(np.mean([model(*batch(split, rng)).item() for _ in range(config["eval_iters"])]))
              for split in ("train", "val")}
    model.train()
    return losses


def main() -> None:
    read_config(sys.argv[1:])
    torch.manual_seed(config["seed"])
    rng = np.random.default_rng(config["seed"])
    with open(os.path.join(config["data_dir"], "meta.pkl"), "rb") as f:
        vocab = pickle.load(f)["vocab_size"]
    model = CharGPT(vocab, config["block_size"], config["n_layer"], config["n_head"], config["n_embd"],
                    config["dropout"]).to(config["device"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["learning_rate"],
                                  weight_decay=config["weight_decay"])
    out_dir = os.environ.get("ORCH_CHECKPOINT_DIR", config["out_dir"])
    os.makedirs(out_dir, exist_ok=True)
    start = 0
    resume = os.environ.get("ORCH_RESUME_FROM") or (
        os.path.join(out_dir, "ckpt.pt") if config["init_from"] == "resume" else None)
    if resume and os.path.exists(resume):
        saved = torch.load(resume, map_location=config["device"])
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        start = saved["iter"] + 1
        print(f"resuming from {resume} at iter {start}", flush=True)
    params = sum(p.numel() for p in model.parameters())
    print(f"number of parameters: {params / 1e6:.2f}M", flush=True)
    tokens = config["batch_size"] * config["block_size"]
    last = time.time()
    for it in range(start, config["max_iters"] + 1):
        if it % config["eval_interval"] == 0 and it > start:
            losses = evaluate(model, rng)
            print(f"step {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}", flush=True)
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iter": it,
                     "config": config}
            torch.save(state, os.path.join(out_dir, "ckpt.pt.tmp"))
            os.replace(os.path.join(out_dir, "ckpt.pt.tmp"), os.path.join(out_dir, "ckpt.pt"))
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(it)
        loss = model(*batch("train", rng))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config["grad_clip"])
        optimizer.step()
        now = time.time()
        if it % config["log_interval"] == 0:
            took = now - last
            print(f"iter {it}: loss {loss.item():.4f}, time {took * 1000:.2f}ms, tok/s {tokens / took:.0f}",
                  flush=True)
        last = now


if __name__ == "__main__":
    main()
