"""The ``[batching]`` keys, their defaults, and their validation.

This is the one place that knows the keys. ``normalize`` takes a plain dict (or anything with
``model_dump()``, such as orch's pydantic model), fills in defaults, and raises ``ValueError``
naming the key and the allowed values::

    >>> normalize({"strategy": "sorted"})["token_budget"]
    49152
"""

from __future__ import annotations

from typing import Any

STRATEGIES = ("sorted", "shuffle", "bucketed", "megabatch")
OVERLONG_POLICIES = ("error", "truncate", "drop")

DEFAULTS: dict[str, Any] = {
    "strategy": "megabatch",
    "token_budget": 49152,
    "max_seq_len": 8192,
    "seed": 0,
    "buckets": None,
    "num_buckets": 6,
    "megabatch": None,
    "target_efficiency": 0.99,
    "window": 8,
    "overlong": "error",
    "lengths": None,
}

def _as_dict(config: Any) -> dict[str, Any]:
    if config is None:
        return {}
    if isinstance(config, dict):
        return dict(config)
    dump = getattr(config, "model_dump", None)
    if callable(dump):
        return dict(dump())
    raise ValueError(f"batching config must be a dict or have model_dump(), got {type(config).__name__}")


def _int(cfg: dict, key: str, minimum: int) -> int:
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
    if value < minimum:
        raise ValueError(f"batching.{key} must be >= {minimum}, got {value}")
    return value


def normalize(config: Any = None) -> dict[str, Any]:
    """Return a complete, validated copy of ``config`` (missing keys take ``DEFAULTS``)."""
    given = _as_dict(config)
    unknown = sorted(set(given) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown batching key(s): {', '.join(unknown)}; known: {', '.join(DEFAULTS)}")
    cfg = dict(DEFAULTS)
    cfg.update({k: v for k, v in given.items() if v is not None})  # None means "the default"

    if cfg["strategy"] not in STRATEGIES:
        raise ValueError(f"batching.strategy must be one of {', '.join(STRATEGIES)}, got {cfg['strategy']!r}")
    if cfg["overlong"] not in OVERLONG_POLICIES:
        raise ValueError(f"batching.overlong must be one of {', '.join(OVERLONG_POLICIES)}, got {cfg['overlong']!r}")
    cfg["max_seq_len"] = _int(cfg, "max_seq_len", 1)
    cfg["token_budget"] = _int(cfg, "token_budget", 1)
    if cfg["token_budget"] < cfg["max_seq_len"]:
        raise ValueError(
            f"batching.token_budget ({cfg['token_budget']}) is smaller than max_seq_len ({cfg['max_seq_len']}):"
            " a sample of max_seq_len tokens would not fit in any batch"
        )
    cfg["seed"] = _int(cfg, "seed", 0)
    cfg["num_buckets"] = _int(cfg, "num_buckets", 1)
    cfg["window"] = _int(cfg, "window", 1)
    if cfg["megabatch"] is not None:
        cfg["megabatch"] = _int(cfg, "megabatch", 1)
    target = cfg["target_efficiency"]
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 < float(target) <= 1:
        raise ValueError(f"batching.target_efficiency must be a number in (0, 1], got {target!r}")
    cfg["target_efficiency"] = float(target)
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

