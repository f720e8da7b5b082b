"""Reading a dataset's sample lengths: ``.npy``, JSONL with a length field, or one integer per line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from .strategies import as_lengths

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")


def load_lengths(path, field: str | None = None) -> np.ndarray:
    """Lengths as an int64 array; ``ValueError`` naming the file and line for anything else.

    ``field`` is the JSONL key holding the length (default ``"length"``).
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    if path.suffix == ".npy":
        try:
            arr = np.load(path, allow_pickle=False)
        except Exception as exc:  # numpy raises several types for a damaged file
            raise ValueError(f"{path}: not a readable .npy file ({exc})") from None
        if arr.ndim != 1:
            raise ValueError(f"{path}: expected a 1-D array of lengths, got shape {arr.shape}")
        lengths = arr
    else:
        text = path.read_text(encoding="utf-8", errors="replace")
        first = text.lstrip()[:1]
        if path.suffix in JSONL_SUFFIXES or first == "{":
            lengths = _parse_jsonl(path, text, field or "length")
        else:
            lengths = _parse_lines(path, text)
    if len(lengths) == 0:
        raise ValueError(f"{path}: no lengths in the file")
    try:
        return as_lengths(lengths)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def _parse_lines(path: Path, text: str) -> list[int]:
    values = []
    for number, line in enumerate(text.splitlines(), 1):
        token = line.strip()
        if not token:
            continue
        try:
            values.append(int(token))
        except ValueError:
            raise ValueError(f"{path}:{number}: expected one integer length per line, got {token[:40]!r}") from None
        if values[-1] < 0:
            raise ValueError(f"{path}:{number}: lengths must be >= 0, got {values[-1]}")
    return values


def _parse_jsonl(path: Path, text: str, field: str) -> list[int]:
    values = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
        if not isinstance(record, dict) or field not in record:
            raise ValueError(f"{path}:{number}: no {field!r} field (choose the length field with --field)")
        value = record[field]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not (math.isfinite(value) and value.is_integer())
        ):
            raise ValueError(f"{path}:{number}: {field!r} must be an integer, got {value!r}")
        if value < 0:
            raise ValueError(f"{path}:{number}: lengths must be >= 0, got {value}")
        values.append(int(value))
    return values
