"""Character-level data for train.py: input.txt becomes train.bin and val.bin (uint16 ids) and meta.pkl (the
vocabulary). The benchmark writes input.txt itself, from the Python standard library's sources, so nothing is
downloaded.

    python prepare.py DATA_DIR
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import numpy as np


def prepare(folder: Path, val_fraction: float = 0.1) -> dict:
    text = (folder / "input.txt").read_text(encoding="utf-8")
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    ids = np.fromiter((index[c] for c in text), dtype=np.uint16, count=len(text))
    cut = int(len(ids) * (1 - val_fraction))
    ids[:cut].tofile(folder / "train.bin")
    ids[cut:].tofile(folder / "val.bin")
    meta = {"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": index}
    with open(folder / "meta.pkl", "wb") as f:
        pickle.dump(meta, f)
    return {"chars": len(text), "vocab": len(chars), "train": cut, "val": len(ids) - cut}


if __name__ == "__main__":
    print(prepare(Path(sys.argv[1] if len(sys.argv) > 1 else ".")))
