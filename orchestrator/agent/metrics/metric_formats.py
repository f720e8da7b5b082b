"""The per-framework metric lines, read where a framework's format says more than its shape (stdlib only, no I/O).

nanoGPT (``iter N: loss X, time Yms, mfu Z%``, ``step N: train loss X, val loss Y``), Hugging Face Trainer's dicts
(``{'loss': 2.31, 'learning_rate': 5e-05, 'epoch': 0.5}``) and tqdm bars (``10/200 [00:05<01:30, 2.10it/s]``),
PyTorch Lightning's bars (tqdm and rich), torchtitan (``step: N  loss: X ... tps: 1,234``) and Megatron-LM
(``iteration N/ M | ... | lm loss: ...``). ``framework`` answers an event, ``{}`` for a line in a framework's shape
that holds no training metric (an evaluation bar), or None for a line no framework printed: the general reader
(``metric_shapes``) reads it then.
"""

from __future__ import annotations

import re

from .metric_shapes import NUMBER as _NUMBER, Event, dict_items, pairs as _parse_pairs

_NUM = f"(?:{_NUMBER})"
_GROUPED = rf"(?:\d{{1,3}}(?:,\d{{3}})+(?:\.\d+)?|{_NUMBER})"  # 1,234 or 1,234.56 (thousands separators)

# nanoGPT train.py: print(f"iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms, mfu {running_mfu*100:.2f}%")
_NANOGPT_ITER = re.compile(rf"\biter (\d+): loss ({_NUM}), time ({_NUM})ms")
_NANOGPT_TAIL = re.compile(rf"\b(mfu|lr) ({_NUM})%?")
# nanoGPT train.py: print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
_NANOGPT_EVAL = re.compile(rf"\bstep (\d+): train loss ({_NUM}), val loss ({_NUM})")

# tqdm: "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
_BAR = re.compile(r"(?:^|(?<=\s)|(?<=:))\s*(\d{1,3})%\|[^|]*\|\s*(\d+)/(\d+)\s*\[([^\]]*)\]")
_BAR_RATE = re.compile(rf"({_NUM})(it/s|s/it)")
_EPOCH_DESC = re.compile(r"\bEpoch (\d+)\b")
# Lightning's RichProgressBar (the default when rich is installed):
#   "Epoch 1/9  ━━━━ 20/20 0:00:03 • 0:00:00 13.2it/s"
_RICH_BAR = re.compile(rf"\bEpoch (\d+)/(\d+)\s.*?\s(\d+)/(\d+)\s+[\d:]+\s*\S\s*[-\d:]+\s+({_NUM})(it/s|s/it)")
_NOT_TRAINING = ("validat", "sanity", "test", "predict", "eval")

# Hugging Face Trainer's closing log (train_runtime, ...): its train_loss is the run's mean, not its last loss
_HF_SUMMARY = {"train_runtime": "runtime_s", "train_steps_per_second": "steps_s", "train_loss": "mean_loss",
               "epoch": "epoch", "step": "step"}

# torchtitan metrics.py: f"step: {step:2}  loss: {loss:7.4f}  grad_norm: ...  memory: ...  tps: {round(tps):,}"
_TITAN = re.compile(rf"\bstep:\s*(\d+)\s+loss:\s*({_NUM})")
_TITAN_FIELD = re.compile(rf"\b(grad_norm|tps|wps|tflops|mfu|lr|step_time):\s*({_GROUPED})")  # wps: older releases

# Megatron-LM training.py training_log: " iteration {:8d}/{:8d} | consumed samples: ... | key: value | ..."
_MEGATRON = re.compile(r"\biteration\s+(\d+)/\s*(\d+)\s*\|")
_MEGATRON_FIELD = re.compile(rf"([A-Za-z][^|:]*?)\s*:\s*({_NUM})\s*(?=\||$)")
_MEGATRON_VAL = re.compile(rf"validation loss at iteration (\d+).*?\blm loss value:\s*({_NUM})")




def framework(text: str) -> Event | None:
    """The event of a line a known framework printed; ``{}`` for its evaluation bars; None for any other line."""
    if "=" not in text and ":" not in text and "|" not in text:
        return None
    if "iter " in text and (m := _NANOGPT_ITER.search(text)):
        return _nanogpt(m, text)
    if " val loss " in text and (m := _NANOGPT_EVAL.search(text)):
        return {"step": float(m[1]), "val_loss": float(m[3])}
    if "%|" in text and (m := _BAR.search(text)):
        return _bar(m, text)
    if "Epoch " in text and "it" in text and (m := _RICH_BAR.search(text)):
        return _rich_bar(m, text)
    if "iteration" in text:
        if (m := _MEGATRON.search(text)) is not None:
            return _megatron(m, text)
        if (m := _MEGATRON_VAL.search(text)) is not None:
            return {"step": float(m[1]), "val_loss": float(m[2])}
    if "train_runtime" in text:
        return _hf_summary(text.strip())
    if ("tps:" in text or "wps:" in text) and (m := _TITAN.search(text)):
        return _torchtitan(m, text)
    return None


def _nanogpt(m: re.Match[str], text: str) -> Event:
    out: Event = {"step": float(m[1]), "loss": float(m[2])}
    ms = float(m[3])
    if ms > 0:
        out["steps_s"] = 1000.0 / ms
    for key, num in _NANOGPT_TAIL.findall(text, m.end()):
        value = float(num)
        if key == "mfu" and value < 0:  # -100.00% until nanoGPT has measured it
            continue
        out[key] = value
    return out


def _bar(m: re.Match[str], text: str) -> Event | None:
    desc = text[:m.start()].strip().lower()
    if desc.startswith(_NOT_TRAINING):
        return {}  # an evaluation bar counts evaluation batches, not training steps
    n, total = float(m[2]), float(m[3])
    inside = m[4]
    rate = _BAR_RATE.search(inside)
    out: Event = {}
    epoch = _EPOCH_DESC.search(text[:m.start()])
    if epoch is not None:  # Lightning: the bar counts this epoch's batches
        if n or rate:
            out["step"] = float(epoch[1]) * total + n
        out["epoch"] = float(epoch[1])
    else:
        if n or rate:
            out["step"] = n
        out["total_steps"] = total
    if rate is not None:
        value = float(rate[1])
        if rate[2] == "s/it":
            value = 1.0 / value if value > 0 else 0.0
        if value > 0:
            out["steps_s"] = value
    # the postfix (Lightning's logged metrics, key=value) follows the rate, which is "?it/s" before the first step
    comma = inside.find(",", rate.end() if rate is not None else inside.find(",") + 1)
    if comma >= 0:
        postfix = _parse_pairs(inside[comma:])
        if postfix:
            postfix.pop("step", None)
            out.update(postfix)
    return out


def _rich_bar(m: re.Match[str], text: str) -> Event:
    epoch, last_epoch, n, per_epoch = (float(g) for g in m.groups()[:4])
    out: Event = {"epoch": epoch, "step": epoch * per_epoch + n, "total_steps": (last_epoch + 1) * per_epoch}
    value = float(m[5])
    if m[6] == "s/it":
        value = 1.0 / value if value > 0 else 0.0
    if value > 0:
        out["steps_s"] = value
    rest = _parse_pairs(text[m.end():])
    if rest:
        rest.pop("step", None)
        out.update(rest)
    return out


def _hf_summary(text: str) -> Event | None:
    items = dict_items(text[text.find("{"):]) if "{" in text else None
    if not items:
        return None
    out: Event = {}
    for key, value in items:
        if key in _HF_SUMMARY:
            out[_HF_SUMMARY[key]] = value
    return out or None


def _torchtitan(m: re.Match[str], text: str) -> Event:
    out: Event = {"step": float(m[1]), "loss": float(m[2])}
    for key, num in _TITAN_FIELD.findall(text, m.end()):
        value = float(num.replace(",", ""))
        if key in ("tps", "wps"):
            out["tok_s"] = value
        elif key == "step_time":
            if value > 0:
                out["steps_s"] = 1.0 / value
        else:
            out[key] = value
    return out


def _megatron(m: re.Match[str], text: str) -> Event:
    out: Event = {"step": float(m[1]), "total_steps": float(m[2])}
    for key, num in _MEGATRON_FIELD.findall(text, m.end()):
        key, value = key.strip().lower(), float(num)
        if key == "elapsed time per iteration (ms)":
            if value > 0:
                out["steps_s"] = 1000.0 / value
        elif key == "learning rate":
            out["lr"] = value
        elif key == "lm loss" or (key.endswith(" loss") and "loss" not in out):
            out["loss"] = value
        elif key == "grad norm":
            out["grad_norm"] = value
        elif key.startswith(("tokens per sec", "tokens/sec", "throughput (tokens")):
            out["tok_s"] = value
        elif key.startswith("throughput per gpu (tflop"):
            out["tflops"] = value
    return out


