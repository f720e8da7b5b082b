"""tinylm: a tiny next-token model in numpy, trained on padded batches of variable-length samples.

Small enough to finish in half a minute on one core, real enough that the batching strategy shows:
every batch is a dense ``n x max_len`` array, so padding costs the same compute as real tokens and
``tok/s`` (real tokens only) drops when a strategy pads more.

Environment (all optional, so the script also runs alone):
    ORCH_EXPERIMENT_ID   printed and stored in checkpoints
    ORCH_RUN_DIR         where ``tinylm-result.json`` is written at the end
    ORCH_CHECKPOINT_DIR  checkpoints (default: ``$ORCH_RUN_DIR/checkpoints`` or ``./checkpoints``)
    ORCH_BATCHING_FILE   JSON of the ``[batching]`` table (strategy, token_budget, max_seq_len, seed, ...)
    TINYLM_STEPS, TINYLM_CKPT_EVERY, TINYLM_LOG_EVERY, TINYLM_SAMPLES, TINYLM_SLEEP,
    TINYLM_CRASH_AT_STEP (exit code 3 once that step is done, on the first attempt only: for crash tests)
    ORCH_RESUME_FROM     the checkpoint to resume from (orch's restarts set it; default: the newest one)

Output, one line every ``log_every`` steps, flushed:  ``step=12 loss=3.2141 tok/s=15234 epoch=0 tokens=51234``
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

try:
    from orchestrator.batching import build_batches
except ImportError:  # train.py copied alone to a machine without orch: see _fallback_batches
    build_batches = None

VOCAB = 128
EMBED = 32
HIDDEN = 96
CRASH_EXIT = 3
BATCHING_DEFAULTS: dict[str, Any] = {"strategy": "megabatch", "token_budget": 4096, "max_seq_len": 512, "seed": 0}
CKPT_NAME = re.compile(r"^ckpt-(\d+)\.npz$")


def make_data(n: int, max_seq_len: int, seed: int = 1234) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fixed-seed samples: lognormal lengths capped at ``max_seq_len``; token t+1 = (5 t + 1) mod V, 10% noise.

    Returns (lengths, offsets, tokens): sample i is ``tokens[offsets[i]:offsets[i] + lengths[i]]``.
    """
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(96), 0.9, n).astype(np.int64), 4, max_seq_len)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    tokens = np.empty(int(lengths.sum()), dtype=np.int64)
    tokens[offsets] = rng.integers(0, VOCAB, n)
    for p in range(1, int(lengths.max())):
        at = offsets[lengths > p] + p
        nxt = (5 * tokens[at - 1] + 1) % VOCAB
        noise = rng.random(len(at)) < 0.1
        nxt[noise] = rng.integers(0, VOCAB, int(noise.sum()))
        tokens[at] = nxt
    return lengths, offsets, tokens


def _fallback_batches(lengths: np.ndarray, config: dict[str, Any], epoch: int) -> list[np.ndarray]:
    """Stand-in for ``orchestrator.batching.build_batches`` when orch is not importable.

    Only two recipes: ``shuffle`` packs a fresh permutation greedily; anything else packs the
    length-sorted samples greedily and shuffles the batch order. Close a batch when
    ``(n + 1) x max_len`` would exceed the token budget.
    """
    rng = np.random.default_rng([int(config["seed"]), epoch])
    budget = int(config["token_budget"])
    shuffle = config["strategy"] == "shuffle"
    order = rng.permutation(len(lengths)) if shuffle else np.argsort(lengths, kind="stable")
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order.tolist():
        length = int(lengths[i])
        if current and (len(current) + 1) * max(longest, length) > budget:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, length)
    if current:
        batches.append(current)
    arrays = [np.asarray(b, dtype=np.int64) for b in batches]
    return arrays if shuffle else [arrays[k] for k in rng.permutation(len(arrays))]


def epoch_batches(lengths: np.ndarray, config: dict[str, Any], epoch: int) -> list[np.ndarray]:
    if build_batches is not None:
        return list(build_batches(lengths, config, epoch=epoch))
    return _fallback_batches(lengths, config, epoch)


def init_params(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "E": (rng.standard_normal((VOCAB, EMBED)) * 0.1).astype(np.float32),
        "W1": (rng.standard_normal((EMBED, HIDDEN)) / np.sqrt(EMBED)).astype(np.float32),
        "b1": np.zeros(HIDDEN, np.float32),
        "W2": (rng.standard_normal((HIDDEN, VOCAB)) / np.sqrt(HIDDEN)).astype(np.float32),
        "b2": np.zeros(VOCAB, np.float32),
    }


def padded_batch(
    idx: np.ndarray, lengths: np.ndarray, offsets: np.ndarray, tokens: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Inputs, targets and mask as dense ``(n, max_len - 1)`` arrays: padding is computed on, not skipped."""
    lens = lengths[idx]
    width = int(lens.max()) - 1
    pos = np.arange(width + 1)
    gather = offsets[idx][:, None] + np.minimum(pos[None, :], lens[:, None] - 1)
    seq = tokens[gather]
    mask = (pos[None, :width] < (lens[:, None] - 1)).astype(np.float32)
    return seq[:, :-1], seq[:, 1:], mask


def loss_and_grads(
    p: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray, mask: np.ndarray
) -> tuple[float, dict[str, np.ndarray]]:
    """Embedding -> tanh layer -> softmax over the vocabulary, on every position including pads."""
    x, y, m = x.ravel(), y.ravel(), mask.ravel()
    e = p["E"][x]
    h = np.tanh(e @ p["W1"] + p["b1"])
    z = h @ p["W2"] + p["b2"]
    z -= z.max(axis=1, keepdims=True)
    probs = np.exp(z)
    probs /= probs.sum(axis=1, keepdims=True)
    rows = np.arange(len(y))
    count = max(float(m.sum()), 1.0)
    loss = float(-(np.log(probs[rows, y] + 1e-9) * m).sum() / count)
    dz = probs
    dz[rows, y] -= 1.0
    dz *= (m / count)[:, None]
    dh = (dz @ p["W2"].T) * (1.0 - h * h)
    de = dh @ p["W1"].T
    dE = np.zeros_like(p["E"])
    np.add.at(dE, x, de)
    grads = {"E": dE, "W1": e.T @ dh, "b1": dh.sum(0), "W2": h.T @ dz, "b2": dz.sum(0)}
    return loss, grads


class Adam:
    def __init__(self, params: dict[str, np.ndarray], lr: float = 0.001) -> None:
        self.lr, self.t = lr, 0
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}

    def step(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> None:
        self.t += 1
        for k, g in grads.items():
            self.m[k] = 0.9 * self.m[k] + 0.1 * g
            self.v[k] = 0.999 * self.v[k] + 0.001 * g * g
            m_hat = self.m[k] / (1 - 0.9**self.t)
            v_hat = self.v[k] / (1 - 0.999**self.t)
            params[k] -= self.lr * m_hat / (np.sqrt(v_hat) + 1e-8)


def save_checkpoint(
    directory: Path, step: int, params: dict[str, np.ndarray], opt: Adam, tokens: int, experiment: str
) -> Path:
    """Write ``ckpt-<step>.npz`` atomically: a temp file beside it, fsync, rename."""
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"ckpt-{step:06d}.npz"
    tmp = directory / f".{final.name}.tmp"
    arrays = {f"p_{k}": v for k, v in params.items()}
    arrays |= {f"m_{k}": v for k, v in opt.m.items()} | {f"v_{k}": v for k, v in opt.v.items()}
    with open(tmp, "wb") as f:
        np.savez(f, step=step, adam_t=opt.t, tokens=tokens, experiment=experiment, **arrays)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    return final


def latest_checkpoint(directory: Path) -> Path | None:
    found = [(int(m.group(1)), p) for p in directory.glob("ckpt-*.npz") if (m := CKPT_NAME.match(p.name))]
    return max(found)[1] if found else None


def load_checkpoint(path: Path, params: dict[str, np.ndarray], opt: Adam) -> tuple[int, int]:
    """Restore ``params`` and ``opt`` in place; returns (step, tokens seen)."""
    with np.load(path) as data:
        for k in params:
            params[k][...] = data[f"p_{k}"]
            opt.m[k][...] = data[f"m_{k}"]
            opt.v[k][...] = data[f"v_{k}"]
        opt.t = int(data["adam_t"])
        return int(data["step"]), int(data["tokens"])


def read_batching(path: str | None) -> dict[str, Any]:
    config = dict(BATCHING_DEFAULTS)
    if path:
        table = json.loads(Path(path).read_text())
        config.update({k: v for k, v in table.items() if v is not None})
    return config


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Flags win over ``TINYLM_*`` variables (argparse converts string defaults with ``type``)."""
    env = os.environ.get
    ap = argparse.ArgumentParser(description="Train tinylm (knobs also read from TINYLM_* variables).")
    ap.add_argument("--steps", type=int, default=env("TINYLM_STEPS") or "3000")
    ap.add_argument("--ckpt-every", type=int, default=env("TINYLM_CKPT_EVERY") or "250")
    ap.add_argument("--log-every", type=int, default=env("TINYLM_LOG_EVERY") or "10")
    ap.add_argument("--samples", type=int, default=env("TINYLM_SAMPLES") or "4000")
    ap.add_argument("--sleep", type=float, default=env("TINYLM_SLEEP") or "0")
    ap.add_argument("--crash-at-step", type=int, default=env("TINYLM_CRASH_AT_STEP") or None)
    return ap.parse_args(argv)


class _Stop(Exception):
    pass


def _on_signal(signum: int, frame: object) -> None:
    raise _Stop(signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    experiment = os.environ.get("ORCH_EXPERIMENT_ID", "")
    run_dir = Path(os.environ["ORCH_RUN_DIR"]) if os.environ.get("ORCH_RUN_DIR") else None
    ckpt_dir = Path(os.environ.get("ORCH_CHECKPOINT_DIR") or (run_dir or Path.cwd()) / "checkpoints")
    config = read_batching(os.environ.get("ORCH_BATCHING_FILE"))
    lengths, offsets, tokens = make_data(args.samples, int(config["max_seq_len"]))
    if build_batches is None:
        print("orchestrator.batching is not importable: using the built-in sorted/shuffle fallback",
              file=sys.stderr, flush=True)

    params = init_params()
    opt = Adam(params)
    step, seen = 0, 0
    given = Path(os.environ["ORCH_RESUME_FROM"]) if os.environ.get("ORCH_RESUME_FROM") else None
    latest = given if given is not None and CKPT_NAME.match(given.name) and given.is_file() \
        else latest_checkpoint(ckpt_dir)
    if latest is not None:
        step, seen = load_checkpoint(latest, params, opt)
        print(f"resumed from step={step} checkpoint={latest.name}", flush=True)
    print(f"experiment={experiment or '-'} strategy={config['strategy']} samples={len(lengths)} "
          f"token_budget={config['token_budget']} max_seq_len={config['max_seq_len']}", flush=True)
    print(f"total_steps={args.steps}", flush=True)

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    epoch, batches, skip = 0, epoch_batches(lengths, config, 0), step
    while skip >= len(batches):
        skip -= len(batches)
        epoch += 1
        batches = epoch_batches(lengths, config, epoch)
    position = skip
    padded = real = 0
    loss = float("nan")
    window_tokens, window_start = 0, time.perf_counter()
    try:
        while step < args.steps:
            if position == len(batches):
                epoch, position = epoch + 1, 0
                batches = epoch_batches(lengths, config, epoch)
            idx = batches[position]
            position += 1
            x, y, mask = padded_batch(idx, lengths, offsets, tokens)
            loss, grads = loss_and_grads(params, x, y, mask)
            opt.step(params, grads)
            step += 1
            batch_tokens = int(lengths[idx].sum())
            seen += batch_tokens
            real += batch_tokens
            padded += len(idx) * int(lengths[idx].max())
            window_tokens += batch_tokens
            if args.sleep:
                time.sleep(args.sleep)
            if step == args.crash_at_step and not int(os.environ.get("ORCH_ATTEMPT") or 0):
                print(f"simulated crash at step={step}", file=sys.stderr, flush=True)
                return CRASH_EXIT
            if step % args.log_every == 0 or step == args.steps:
                now = time.perf_counter()
                rate = window_tokens / max(now - window_start, 1e-9)
                print(f"step={step} loss={loss:.4f} tok/s={rate:.0f} epoch={epoch} tokens={seen}", flush=True)
                window_tokens, window_start = 0, now
            if step % args.ckpt_every == 0 or step == args.steps:
                save_checkpoint(ckpt_dir, step, params, opt, seen, experiment)
    except _Stop as stop:
        path = save_checkpoint(ckpt_dir, step, params, opt, seen, experiment)
        print(f"stopped by signal {stop.args[0]} at step={step}, saved {path.name}", flush=True)
        return 128 + int(stop.args[0])

    efficiency = real / padded if padded else 1.0
    print(f"done step={step} real_tokens={real} padded_tokens={padded} efficiency={efficiency:.4f}", flush=True)
    if run_dir is not None:
        result = {"experiment": experiment, "step": step, "loss": loss if real else None,
                  "real_tokens": real, "padded_tokens": padded, "efficiency": efficiency}
        tmp = run_dir / ".tinylm-result.json.tmp"
        tmp.write_text(json.dumps(result, indent=2) + "\n")
        os.replace(tmp, run_dir / "tinylm-result.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
