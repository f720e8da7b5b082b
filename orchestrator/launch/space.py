"""A sweep's search space from its ``--set`` values: lists of choices, or ranges to sample (pure).

A value with parentheses is a distribution, read whole (its comma is not a list separator); anything else is a
comma-separated list of choices, as a grid has always been:

    axis("run.lr=loguniform(1e-5,1e-2)") -> ("run.lr", Range("loguniform", 1e-05, 0.01))
    axis("batching.strategy=sorted,shuffle") -> ("batching.strategy", Choice(("sorted", "shuffle")))
    axis("project.env.LAYERS=int(1,8)") -> ("project.env.LAYERS", Range("int", 1, 8))

``plan`` then decides what kind of sweep the axes make (today's grid, or a search the conductor runs) and refuses
every mix that cannot run, before anything is asked of a target.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from typing import Union

from ..errors import InputError

RANGES = ("uniform", "loguniform", "int", "logint")
SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("median", "asha", "none")
MAX_VARIANTS = 256
_CALL = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\((.*)\)$", re.S)
_EXAMPLE = "e.g. --set run.lr=loguniform(1e-5,1e-2) --trials 12"


@dataclass(frozen=True)
class Choice:
    values: tuple[str, ...]


@dataclass(frozen=True)
class Range:
    kind: str  # one of RANGES
    low: float
    high: float

    @property
    def log(self) -> bool:
        return self.kind.startswith("log")

    @property
    def integer(self) -> bool:
        return self.kind in ("int", "logint")


Dist = Union[Choice, Range]


def split_top(raw: str) -> list[str]:
    """``raw`` split at the commas outside parentheses: ``a,f(1,2)`` -> ``["a", "f(1,2)"]``."""
    parts, depth, current = [], 0, []
    for ch in raw:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    parts.append("".join(current).strip())
    return parts


def _number(item: str, text: str, integer: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"--set {item!r}: {text.strip()!r} is not a number", hint=_EXAMPLE) from None
    if not math.isfinite(value):
        raise InputError(f"--set {item!r}: {text.strip()!r} is not a finite number", hint=_EXAMPLE)
    if integer and value != int(value):
        raise InputError(f"--set {item!r}: an int range takes whole numbers, not {text.strip()!r}",
                         hint="e.g. --set project.env.LAYERS=int(1,8)")
    return value


def _distribution(item: str, name: str, inner: str) -> Dist:
    args = split_top(inner)
    if name == "choice":
        if not all(args):
            raise InputError(f"--set {item!r} has an empty choice", hint="e.g. choice(sorted,shuffle)")
        return _choices(item, args)
    if name not in RANGES:
        raise InputError(f"--set {item!r}: unknown distribution {name!r}",
                         hint=f"use one of {', '.join(RANGES)} or choice, e.g. loguniform(1e-5,1e-2); "
                              "a list of values is written a,b,c")
    if len(args) != 2:
        raise InputError(f"--set {item!r}: {name} takes two bounds, low and high", hint=f"e.g. {name}(1,8)")
    integer = name in ("int", "logint")
    low, high = (_number(item, a, integer) for a in args)
    if low >= high:
        raise InputError(f"--set {item!r}: the bounds are reversed or equal ({args[0]} >= {args[1]})",
                         hint=f"give the low bound first: {name}({args[1]},{args[0]})" if low > high
                         else "a range needs two different bounds; a single value is --set KEY=VALUE")
    if name.startswith("log") and low <= 0:
        raise InputError(f"--set {item!r}: a log range must be above 0, and this one reaches {args[0]}",
                         hint=f"start it above 0, e.g. {name}(1e-6,{args[1]}), or use "
                              f"{'int' if integer else 'uniform'}({args[0]},{args[1]})")
    return Range(name, low, high)


def _choices(item: str, values: list[str]) -> Choice:
    if len(set(values)) != len(values):
        raise InputError(f"--set {item!r} repeats a value", hint="give each value once")
    return Choice(tuple(values))


def axis(item: str) -> tuple[str, Dist]:
    """One ``--set`` as its key and distribution."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key or "." not in key:
        raise InputError(f"--set {item!r} is not section.key=value1,value2",
                         hint="e.g. --set batching.strategy=sorted,shuffle")
    raw = raw.strip()
    call = _CALL.match(raw)
    if call:
        return key, _distribution(item, call.group(1), call.group(2))
    values = split_top(raw)
    if not all(values):
        raise InputError(f"--set {item!r} has an empty value", hint="separate the values with single commas")
    if any("(" in v or ")" in v for v in values):
        raise InputError(f"--set {item!r} mixes a distribution into a list of values",
                         hint="a key is either a list (a,b,c) or one distribution, such as uniform(0,1)")
    return key, _choices(item, values)


def axes(sets: list[str]) -> dict[str, Dist]:
    if not sets:
        raise InputError("a sweep needs at least one --set key=value1,value2",
                         hint="e.g. orch sweep --set batching.strategy=sorted,shuffle,bucketed --steps 200")
    out: dict[str, Dist] = {}
    for item in sets:
        key, dist = axis(item)
        if key in out:
            raise InputError(f"--set {key} is given twice", hint="list all its values in one --set, comma-separated")
        out[key] = dist
    return out


def grid(space: dict[str, Dist]) -> list[dict[str, str]]:
    """Every combination of a space of choices, the first key varying slowest."""
    lists = [d.values for d in space.values() if isinstance(d, Choice)]
    combos = [dict(zip(space, chosen)) for chosen in itertools.product(*lists)]
    if len(combos) > MAX_VARIANTS:
        raise InputError(f"the sweep has {len(combos)} variants, more than {MAX_VARIANTS}",
                         hint="sweep fewer values at once")
    return combos


@dataclass
class Plan:
    space: dict[str, Dist]
    search: bool  # False: today's grid, every variant to its budget; True: the conductor asks Optuna
    sampler: str | None = None
    trials: int | None = None


def plan(sets: list[str], trials: int | None = None, sampler: str | None = None, searching: bool = False) -> Plan:
    """What the ``--set`` values and flags make. ``searching``: a flag only a search takes was given
    (``--prune``, ``--metric``, ...), so even a grid of lists runs under the conductor."""
    space = axes(sets)
    ranges = [k for k, d in space.items() if isinstance(d, Range)]
    if sampler is not None and sampler not in SAMPLERS:
        raise InputError(f"--sampler {sampler!r} is not one of {', '.join(SAMPLERS)}", hint="e.g. --sampler tpe")
    if ranges and trials is None:
        raise InputError(f"--set {ranges[0]} is a range: a search of it needs --trials N",
                         hint=f"say how many trials to run, {_EXAMPLE}")
    if ranges and sampler == "grid":
        raise InputError(f"--sampler grid cannot sample the range of --set {ranges[0]}",
                         hint="give it a list of values (a,b,c), or use --sampler tpe or random")
    if not ranges and trials is not None and sampler in (None, "grid"):
        raise InputError("--trials N with only lists of values: a grid runs each combination once",
                         hint="drop --trials, give a range (" + _EXAMPLE + "), or --sampler random to draw "
                              "N trials from the lists")
    if ranges:
        return Plan(space, True, sampler or "tpe", trials)
    if sampler in ("tpe", "random"):
        return Plan(space, True, sampler, trials or len(grid(space)))
    size = len(grid(space))
    if sampler == "grid" or searching:
        return Plan(space, True, "grid", size)
    return Plan(space, False, None, size)


def default_min_steps(steps: int) -> int:
    """A search's grace before pruning, and the distance between its rungs, when ``--min-steps`` is not given: a
    twelfth of the budget. A tenth (the first default) spent 7 to 14% more steps for the same best on each of
    benchmarks/bench_search.py's three surfaces; a twentieth pruned trials whose best was yet to come."""
    return max(1, steps // 12)


def as_set(key: str, value: object) -> str:
    """A sampled value as the ``--set`` override it becomes (a float keeps every digit Optuna chose)."""
    if isinstance(value, float):
        return f"{key}={value!r}"
    return f"{key}={value}"
