"""Log line -> metric event: the default formats (key=value, key: value, JSON lines) and user regexes.

Pure and fast (precompiled patterns, cheap pre-checks): ``orch status`` parses whole logs with it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping

from orchestrator.errors import ConfigError

Event = dict[str, float]

# (keys as written in logs, lower-cased), canonical metric, multiplier
_ALIAS_GROUPS: tuple[tuple[tuple[str, ...], str, float], ...] = (
    (("step", "steps", "iter", "iteration", "global_step"), "step", 1.0),
    (("loss", "train_loss", "training_loss", "train/loss"), "loss", 1.0),
    (("val_loss", "eval_loss", "valid_loss", "val/loss"), "val_loss", 1.0),
    (("tok/s", "tok_s", "tokens/s", "tokens/sec", "tok/sec", "tokens_per_sec",
      "tokens_per_second", "tps"), "tok_s", 1.0),
    (("ktok/s", "ktok_s", "ktokens/s", "ktok/sec"), "tok_s", 1e3),
    (("mtok/s", "mtok_s", "mtokens/s"), "tok_s", 1e6),
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
_PAIR = re.compile(
    r"(?<![\w./-])([A-Za-z][\w./-]*)['\"]?\s*[=:]\s*(" + _NUMBER + r")(?:/(\d+))?([kKmMbBG]?)(?![\w.])"
)


class Parser:
    """Turns one log line into ``{metric: value}`` or ``None`` when the line holds no metric.

    ``patterns`` maps a metric name to a regex with exactly one group, e.g. ``{"loss": "L=([0-9.]+)"}``.
    """

    def __init__(self, patterns: Mapping[str, str] | None = None) -> None:
        self._user: list[tuple[str, float, re.Pattern[str]]] = []
        for name, source in (patterns or {}).items():
            rx = _compile_pattern(name, source)
            canon, scale = _ALIASES.get(name.lower(), (name, 1.0))
            self._user.append((canon, scale, rx))

    def parse_line(self, line: str) -> Event | None:
        out: Event | None = None
        if "=" in line or ":" in line:
            stripped = line.lstrip()
            if stripped.startswith("{"):
                out = _parse_json(stripped)
            else:
                out = _parse_pairs(line)
        for name, scale, rx in self._user:
            m = rx.search(line)
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

    def parse_lines(self, lines: Iterable[str]) -> list[Event]:
        """All events of ``lines``, in order, skipping lines without metrics."""
        parse = self.parse_line
        return [e for e in map(parse, lines) if e is not None]


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
