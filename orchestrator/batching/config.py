"""The ``[batching]`` keys: one table of names, types, defaults, bounds and meaning, and their validation.

``KEYS`` is the one place that knows the keys; orch's ``[batching]`` settings section is built from it
(``orchestrator.config``), and ``normalize`` checks a plain dict (or anything with ``model_dump()``)
against it, fills in defaults, and raises ``ValueError`` naming the key and the allowed values::

    >>> normalize({"strategy": "sorted"})["token_budget"]
    49152
    >>> KEYS["window"].doc
    'stratified order: every `window` steps mix short and long batches'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

STRATEGIES = ("sorted", "shuffle", "bucketed", "megabatch")
OVERLONG_POLICIES = ("error", "truncate", "drop")


@dataclass(frozen=True)
class Key:
    """One ``[batching]`` key. ``type``: int, float, str or list (of ints); a None default means "optional"."""

    type: type
    default: Any
    doc: str
    choices: tuple[str, ...] = ()  # for a str: the allowed values
    minimum: float | None = None  # for a number: the smallest allowed value
    above: float | None = None  # for a number: the value must be greater than this
    maximum: float | None = None  # for a number: the largest allowed value


KEYS: dict[str, Key] = {
    "strategy": Key(str, "megabatch", "how samples are grouped into batches", choices=STRATEGIES),
    "token_budget": Key(int, 49152, "tokens per batch, padding included", minimum=1),
    "max_seq_len": Key(int, 8192, "the longest sample, in tokens", minimum=1),
    "seed": Key(int, 0, "the seed of every shuffle", minimum=0),
    "buckets": Key(list, None, "bucket boundaries for strategy = \"bucketed\", from 0 to max_seq_len"),
    "num_buckets": Key(int, 6, "buckets to optimize when no boundaries are given", minimum=1, maximum=256),
    "megabatch": Key(int, None, "batches per megabatch; none: chosen from the data", minimum=1),
    "target_efficiency": Key(float, 0.99, "the share of sorted's padding efficiency a chosen megabatch keeps",
                             above=0, maximum=1),
    "window": Key(int, 8, "stratified order: every `window` steps mix short and long batches", minimum=1),
    "overlong": Key(str, "error", "what happens to a sample longer than max_seq_len", choices=OVERLONG_POLICIES),
    "lengths": Key(str, None, "a file of sample lengths (.npy, .txt, .json, .parquet) to plan each launch with"),
}

DEFAULTS: dict[str, Any] = {name: key.default for name, key in KEYS.items()}

def _as_dict(config: Any) -> dict[str, Any]:
    if config is None:
        return {}
    if isinstance(config, dict):
        return dict(config)
    dump = getattr(config, "model_dump", None)
    if callable(dump):
        return dict(dump())
    raise ValueError(f"batching config must be a dict or have model_dump(), got {type(config).__name__}")


def _int(cfg: dict, key: str) -> int:
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, int):
        # numpy integers and integral floats from JSON are accepted; anything else is an error.
        try:
            as_int = int(value)
        except (TypeError, ValueError):
            as_int = None
        if as_int is None or as_int != value:
            raise ValueError(f"batching.{key} must be an integer, got {value!r}")
        value = as_int
    return _bounded(key, value)


def _bounded(name: str, value: float) -> Any:
    key = KEYS[name]
    if key.minimum is not None and value < key.minimum:
        raise ValueError(f"batching.{name} must be >= {key.minimum:g}, got {value}")
    if key.above is not None and value <= key.above:
        raise ValueError(f"batching.{name} must be > {key.above:g}, got {value}")
    if key.maximum is not None and value > key.maximum:
        raise ValueError(f"batching.{name} must be <= {key.maximum:g}, got {value}")
    return value


def _float(cfg: dict, name: str) -> float:
    value = cfg[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"batching.{name} must be a number, got {value!r}")
    return _bounded(name, float(value))


def normalize(config: Any = None) -> dict[str, Any]:
    """Return a complete, validated copy of ``config`` (missing keys take ``DEFAULTS``)."""
    given = _as_dict(config)
    unknown = sorted(set(given) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown batching key(s): {', '.join(unknown)}; known: {', '.join(DEFAULTS)}")
    cfg = dict(DEFAULTS)
    cfg.update({k: v for k, v in given.items() if v is not None})  # None means "the default"

    for name, key in KEYS.items():
        if key.choices and cfg[name] not in key.choices:
            raise ValueError(f"batching.{name} must be one of {', '.join(key.choices)}, got {cfg[name]!r}")
        if key.type is int and cfg[name] is not None:
            cfg[name] = _int(cfg, name)
        if key.type is float and cfg[name] is not None:
            cfg[name] = _float(cfg, name)
    if cfg["token_budget"] < cfg["max_seq_len"]:
        raise ValueError(
            f"batching.token_budget ({cfg['token_budget']}) is smaller than max_seq_len ({cfg['max_seq_len']}):"
            " a sample of max_seq_len tokens would not fit in any batch"
        )
    if cfg["buckets"] is not None:
        cfg["buckets"] = check_boundaries(cfg["buckets"], cfg["max_seq_len"])
    return cfg


def check_boundaries(buckets: Any, max_seq_len: int) -> list[int]:
    """Bucket boundaries: ascending ints from 0 to ``max_seq_len``; bucket k holds ``b[k-1] < len <= b[k]``."""
    try:
        values = [int(b) for b in buckets]
    except (TypeError, ValueError):
        raise ValueError(f"batching.buckets must be a list of integers, got {buckets!r}") from None
    if any(v != b for v, b in zip(values, buckets)):
        raise ValueError(f"batching.buckets must be a list of integers, got {buckets!r}")
    if len(values) < 2 or values[0] != 0 or values[-1] != max_seq_len:
        raise ValueError(
            f"batching.buckets must start at 0 and end at max_seq_len ({max_seq_len}), got {values}"
        )
    if any(b >= c for b, c in zip(values, values[1:])):
        raise ValueError(f"batching.buckets must be strictly ascending, got {values}")
    return values

