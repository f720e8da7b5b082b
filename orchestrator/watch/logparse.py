"""Log line -> metric event: the formats training frameworks print, plus user regexes.

Pure and fast (precompiled patterns, cheap substring checks before any regex): ``orch status`` parses
whole logs with it. Recognised with no configuration, most specific first:

    >>> Parser().parse_line("iter 10: loss 2.3456, time 5.86ms, mfu 1.23%")       # nanoGPT
    {'step': 10.0, 'loss': 2.3456, 'steps_s': 170.64846416382252, 'mfu': 1.23}

- nanoGPT (``iter N: loss X, time Yms, mfu Z%``, ``step N: train loss X, val loss Y``),
- Hugging Face Trainer's dict lines (``{'loss': 2.31, 'learning_rate': 5e-05, 'epoch': 0.5}``, values as
  numbers, quoted strings or ``np.float64(...)``) and tqdm bars (``10/200 [00:05<01:30, 2.10it/s]``),
- PyTorch Lightning's bars (tqdm: ``Epoch 1: 45%|...| 45/100 [..., 13.2it/s, v_num=0, train_loss=2.310]``;
  rich: ``Epoch 1/9 ━━━ 45/100 0:00:03 • 0:00:04 13.2it/s train_loss: 2.310``),
- torchtitan (``step: N  loss: X ... tps: 1,234 ...``), Megatron-LM (``iteration N/ M | ... | lm loss: ...``),
- ``key=value`` / ``key: value`` pairs and JSON lines.

ANSI colour codes are dropped first; a ``\\r``-separated line is one update per piece (``parse_line``
merges them, so the last one wins). Throughput is ``tok_s`` only where the line gives tokens per second;
a rate that counts steps (time per iteration, it/s) is ``steps_s``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping

from orchestrator.errors import ConfigError

Event = dict[str, float]

# Bumped whenever a line may now read differently: stored summaries made by another version are re-read.
PARSER_VERSION = 2

# (keys as written in logs, lower-cased), canonical metric, multiplier
_ALIAS_GROUPS: tuple[tuple[tuple[str, ...], str, float], ...] = (
    (("step", "steps", "iter", "iteration", "global_step"), "step", 1.0),
    (("loss", "train_loss", "training_loss", "train/loss", "train_loss_step", "lm_loss"), "loss", 1.0),
    (("val_loss", "eval_loss", "valid_loss", "val/loss", "validation_loss"), "val_loss", 1.0),
    (("tok/s", "tok_s", "tokens/s", "tokens/sec", "tok/sec", "tokens_per_sec",
      "tokens_per_second", "tps"), "tok_s", 1.0),
    (("ktok/s", "ktok_s", "ktokens/s", "ktok/sec"), "tok_s", 1e3),
    (("mtok/s", "mtok_s", "mtokens/s"), "tok_s", 1e6),
    (("it/s", "steps/s", "steps_per_second", "steps_per_sec"), "steps_s", 1.0),
    (("lr", "learning_rate"), "lr", 1.0),
    (("grad_norm", "gnorm", "grad-norm", "gradnorm", "grad_norm_total"), "grad_norm", 1.0),
    (("epoch", "ep"), "epoch", 1.0),
    (("total_steps", "max_steps", "num_steps"), "total_steps", 1.0),
    (("tokens", "tokens_seen", "ntokens", "consumed_tokens"), "tokens", 1.0),
    (("total_tokens", "target_tokens", "train_tokens"), "total_tokens", 1.0),
)
_ALIASES = {name: (canon, scale) for names, canon, scale in _ALIAS_GROUPS for name in names}
_JSON_TIME_KEYS = ("time", "timestamp", "ts")
_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9}

_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?i:nan|inf)"
_NUM = f"(?:{_NUMBER})"
_GROUPED = rf"(?:\d{{1,3}}(?:,\d{{3}})+(?:\.\d+)?|{_NUMBER})"  # 1,234 or 1,234.56 (thousands separators)
_PAIR = re.compile(
    r"(?<![\w./-])([A-Za-z][\w./-]*)['\"]?\s*[=:]\s*(" + _NUMBER + r")(?:/(\d+))?([kKmMbBG]?)(?![\w.])"
)
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")

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

# Hugging Face ProgressCallback.on_log: str(logs), floats as numbers, f"{v:.4g}" strings or numpy reprs
_HF_ITEM = re.compile(
    rf"'([^']+)':\s*(?:(?:np|numpy)\.\w+\(|tensor\()?['\"]?({_NUMBER})['\"]?\)?\s*(?=[,}}])")
_HF_KEYS = {"loss": "loss", "grad_norm": "grad_norm", "learning_rate": "lr", "epoch": "epoch",
            "eval_loss": "val_loss", "train_steps_per_second": "steps_s", "train_runtime": "runtime_s",
            "train_loss": "mean_loss", "step": "step"}

# torchtitan metrics.py: f"step: {step:2}  loss: {loss:7.4f}  grad_norm: ...  memory: ...  tps: {round(tps):,}"
_TITAN = re.compile(rf"\bstep:\s*(\d+)\s+loss:\s*({_NUM})")
_TITAN_FIELD = re.compile(rf"\b(grad_norm|tps|wps|tflops|mfu|lr|step_time):\s*({_GROUPED})")  # wps: older releases

# Megatron-LM training.py training_log: " iteration {:8d}/{:8d} | consumed samples: ... | key: value | ..."
_MEGATRON = re.compile(r"\biteration\s+(\d+)/\s*(\d+)\s*\|")
_MEGATRON_FIELD = re.compile(rf"([A-Za-z][^|:]*?)\s*:\s*({_NUM})\s*(?=\||$)")
_MEGATRON_VAL = re.compile(rf"validation loss at iteration (\d+).*?\blm loss value:\s*({_NUM})")


class Parser:
    """Turns one log line into ``{metric: value}`` or ``None`` when the line holds no metric.

    ``patterns`` maps a metric name to a regex with exactly one group, e.g. ``{"loss": "L=([0-9.]+)"}``;
    it is matched against each update of the line with colour codes removed, and wins over the built-in formats.
    """

    def __init__(self, patterns: Mapping[str, str] | None = None) -> None:
        self._user: list[tuple[str, float, re.Pattern[str]]] = []
        for name, source in (patterns or {}).items():
            rx = _compile_pattern(name, source)
            canon, scale = _ALIASES.get(name.lower(), (name, 1.0))
            self._user.append((canon, scale, rx))

    def parse_line(self, line: str) -> Event | None:
        """The line's metrics; with several ``\\r`` updates in it, later values win."""
        if "\r" not in line and "\x1b" not in line:
            return self._parse_piece(line)
        out: Event | None = None
        for event in self.events(line):
            out = event if out is None else {**out, **event}
        return out

    def events(self, line: str) -> Iterator[Event]:
        """One event per ``\\r``-separated update of ``line`` that holds a metric, in order."""
        line = plain(line)
        for piece in line.split("\r") if "\r" in line else (line,):
            event = self._parse_piece(piece)
            if event is not None:
                yield event

    def parse_lines(self, lines: Iterable[str]) -> list[Event]:
        """All events of ``lines``, in order, skipping lines without metrics."""
        out: list[Event] = []
        piece = self._parse_piece
        for line in lines:
            if "\r" in line or "\x1b" in line:
                out.extend(self.events(line))
            elif (event := piece(line)) is not None:
                out.append(event)
        return out

    def _parse_piece(self, text: str) -> Event | None:
        out = _builtin(text)
        if not self._user:
            return out
        for name, scale, rx in self._user:
            m = rx.search(text)
            if m is None:
                continue
            try:
                value = float(m.group(1)) * scale
            except (TypeError, ValueError):
                continue
            if out is None:
                out = {}
            out[name] = value
        return out


def plain(text: str) -> str:
    """``text`` without its ANSI escapes (colours, cursor moves), as people read it."""
    return _ANSI.sub("", text) if "\x1b" in text else text


def parser_key(patterns: Mapping[str, str] | None) -> str:
    """Names the way logs are read: the parser's version and the user's patterns. Stored metrics made
    under another key are stale."""
    digest = hashlib.sha256(json.dumps(dict(patterns or {}), sort_keys=True).encode()).hexdigest()[:16]
    return f"{PARSER_VERSION}:{digest}"


def _builtin(text: str) -> Event | None:
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
    stripped = text.lstrip()
    if stripped.startswith("{'"):
        event = _hf_dict(stripped)
        if event is not None:
            return event
    if ("tps:" in text or "wps:" in text) and (m := _TITAN.search(text)):
        return _torchtitan(m, text)
    if stripped.startswith("{"):
        return _parse_json(stripped)
    return _parse_pairs(text)


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
        return None  # an evaluation bar counts evaluation batches, not training steps
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
    comma = inside.find(",", rate.end()) if rate is not None else -1
    if comma >= 0:  # the postfix: Lightning's logged metrics, key=value
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


def _hf_dict(text: str) -> Event | None:
    if not text.rstrip().endswith("}"):
        return None
    out: Event = {}
    for key, num in _HF_ITEM.findall(text):
        canon = _HF_KEYS.get(key)
        if canon is None:
            known = _ALIASES.get(key.lower())
            if known is None:
                continue
            out[known[0]] = float(num) * known[1]
        else:
            out[canon] = float(num)
    if "runtime_s" in out and "mean_loss" in out:
        out.pop("loss", None)  # the summary's train_loss is the run's mean, not its last loss
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


def _compile_pattern(name: str, source: object) -> re.Pattern[str]:
    where = f"[metrics] patterns.{name} in orch.toml"
    if not isinstance(source, str):
        raise ConfigError(f"metrics pattern {name!r} is not a string: {source!r}",
                          f"write {where} as a quoted regex, e.g. 'L=([0-9.]+)'")
    try:
        rx = re.compile(source)
    except re.error as exc:
        raise ConfigError(f"metrics pattern {name!r} is not a valid regex: {exc}",
                          f"fix {where} (single quotes keep backslashes literal)") from exc
    if rx.groups != 1:
        raise ConfigError(f"metrics pattern {name!r} has {rx.groups} groups, needs exactly 1",
                          f"in {where} capture only the number, e.g. 'L=([0-9.]+)'; use (?:...) elsewhere")
    return rx


def _parse_pairs(line: str) -> Event | None:
    out: Event | None = None
    aliases = _ALIASES
    for key, num, total, suffix in _PAIR.findall(line):
        known = aliases.get(key.lower())
        if known is None:
            continue
        canon, scale = known
        value = float(num)
        if suffix:
            value *= _SUFFIX[suffix.lower()]
        if out is None:
            out = {}
        out[canon] = value * scale
        if total and canon == "step":
            out["total_steps"] = float(total)
    return out


def _parse_json(text: str) -> Event | None:
    try:
        obj = json.loads(text)
    except ValueError:
        return _parse_pairs(text)
    if not isinstance(obj, dict):
        return None
    out: Event = {}
    for key, value in obj.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        lowered = key.lower()
        known = _ALIASES.get(lowered)
        if known is not None:
            out[known[0]] = float(value) * known[1]
        elif lowered in _JSON_TIME_KEYS:
            out["t"] = float(value)
    return out or None
