"""load_lengths on each format and each bad input; config validation; the sampler; import isolation."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

import orchestrator.batching as batching
from orchestrator.batching import BatchSampler, DEFAULTS, load_lengths, normalize


def test_npy_text_and_jsonl(tmp_path):
    np.save(tmp_path / "a.npy", np.array([3, 1, 2], dtype=np.int32))
    assert load_lengths(tmp_path / "a.npy").tolist() == [3, 1, 2]
    np.save(tmp_path / "f.npy", np.array([3.0, 4.0]))
    assert load_lengths(tmp_path / "f.npy").dtype == np.int64
    (tmp_path / "a.txt").write_text("5\n 6\n\n7\n")
    assert load_lengths(tmp_path / "a.txt").tolist() == [5, 6, 7]
    (tmp_path / "a.jsonl").write_text('{"length": 4, "x": "y"}\n{"length": 9}\n')
    assert load_lengths(tmp_path / "a.jsonl").tolist() == [4, 9]
    (tmp_path / "b.jsonl").write_text('{"n_tokens": 4}\n\n{"n_tokens": 8.0}\n')
    assert load_lengths(tmp_path / "b.jsonl", field="n_tokens").tolist() == [4, 8]


@pytest.mark.parametrize("name, content, message", [
    ("empty.txt", "", "no lengths"),
    ("blank.txt", "\n\n", "no lengths"),
    ("neg.txt", "3\n-2\n", r"neg.txt:2: lengths must be >= 0"),
    ("float.txt", "3\n2.5\n", r"float.txt:2: expected one integer"),
    ("word.txt", "abc\n", r"word.txt:1: expected one integer"),
    ("empty.jsonl", "", "no lengths"),
    ("neg.jsonl", '{"length": -1}\n', r"neg.jsonl:1: lengths must be >= 0"),
    ("float.jsonl", '{"length": 1.5}\n', "must be an integer"),
    ("bool.jsonl", '{"length": true}\n', "must be an integer"),
    ("missing.jsonl", '{"len": 3}\n', "no 'length' field"),
    ("broken.jsonl", '{"length": 3\n', "not valid JSON"),
])
def test_bad_files(tmp_path, name, content, message):
    (tmp_path / name).write_text(content)
    with pytest.raises(ValueError, match=message):
        load_lengths(tmp_path / name)


@pytest.mark.parametrize("array, message", [
    (np.array([], dtype=np.int64), "no lengths"),
    (np.array([1, -3]), ">= 0"),
    (np.array([1.5]), "integers"),
    (np.array([[1, 2]]), "1-D"),
    (np.array(["a"]), "integers"),
])
def test_bad_npy(tmp_path, array, message):
    np.save(tmp_path / "x.npy", array)
    with pytest.raises(ValueError, match=message):
        load_lengths(tmp_path / "x.npy")


def test_missing_file(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        load_lengths(tmp_path / "nope.npy")


def test_config_defaults_and_validation():
    assert normalize(None) == {**DEFAULTS}
    assert normalize({"token_budget": None})["token_budget"] == 49152

    class Model:
        def model_dump(self):
            return {"strategy": "sorted", "window": 1}

    assert normalize(Model())["strategy"] == "sorted"
    for bad, message in [
        ({"token_budget": 4096, "max_seq_len": 8192}, "smaller than max_seq_len"),
        ({"strategy": "random"}, "strategy must be one of"),
        ({"overlong": "ignore"}, "overlong must be one of"),
        ({"buckets": [0, 100, 50, 8192]}, "strictly ascending"),
        ({"buckets": [10, 8192]}, "start at 0"),
        ({"buckets": [0, 1.5, 8192]}, "integers"),
        ({"window": 0}, "window must be >= 1"),
        ({"seed": -1}, "seed must be >= 0"),
        ({"megabatch": "lots"}, "megabatch must be an integer"),
        ({"target_efficiency": 1.5}, "target_efficiency"),
        ({"tokens": 5}, "unknown batching key"),
    ]:
        with pytest.raises(ValueError, match=message):
            normalize(bad)


def test_sampler_epochs_and_len():
    lengths = np.random.default_rng(0).integers(1, 2000, 5000)
    sampler = BatchSampler(lengths, {"token_budget": 16384, "max_seq_len": 2048}, rank=1, world_size=2)
    assert sampler.config["megabatch"] >= 1  # chosen once, at construction
    first = list(sampler)
    assert len(sampler) == len(first) and all(isinstance(i, int) for b in first for i in b)
    sampler.set_epoch(1)
    second = list(sampler)
    assert second != first
    expected = batching.build_batches(lengths, sampler.config, epoch=1, rank=1, world_size=2)
    assert second == [b.tolist() for b in expected]
    assert sampler.overlong["overlong"] == 0


def test_resolved_config_rebuilds_the_same_batches():
    lengths = np.random.default_rng(0).integers(1, 3000, 4000)
    resolved = batching.resolve(lengths, {"token_budget": 16384, "max_seq_len": 4096})
    assert resolved["config"]["megabatch"] >= 1
    assert set(resolved["planned"]) >= {"efficiency", "efficiency_vs_sorted", "d1", "d2", "s_and_l", "batches", "overlong"}
    json.dumps(resolved)
    again = batching.build_batches(lengths, resolved["config"], epoch=0)
    auto = batching.build_batches(lengths, {"token_budget": 16384, "max_seq_len": 4096}, epoch=0)
    assert [b.tolist() for b in again] == [b.tolist() for b in auto]
    bucketed = batching.resolve(lengths, {"strategy": "bucketed", "num_buckets": 4, "token_budget": 16384, "max_seq_len": 4096})
    assert len(bucketed["config"]["buckets"]) == 5


def test_ships_alone_in_a_zip_with_only_numpy(tmp_path):
    """Training machines import the package from a zip; nothing else of orch may be needed."""
    package = Path(batching.__file__).parent
    archive = tmp_path / "batching.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        # zipimport has no namespace packages, so the (import-free) top-level __init__ ships too.
        zf.write(package.parent / "__init__.py", "orchestrator/__init__.py")
        for source in package.glob("*.py"):
            zf.write(source, f"orchestrator/batching/{source.name}")
    script = (
        "import sys; sys.path[:0] = sys.argv[1:3]\n"
        "import orchestrator.batching as b\n"
        "assert b.__file__.startswith(sys.argv[1]), b.__file__\n"
        "print(len(b.build_batches([5, 3, 8, 2], {'strategy': 'sorted', 'token_budget': 16, 'max_seq_len': 8})))\n"
        "heavy = {'typer', 'rich', 'fabric', 'pydantic', 'paramiko', 'torch', 'matplotlib'} & set(sys.modules)\n"
        "others = [m for m in sys.modules if m.startswith('orchestrator') and not m.startswith('orchestrator.batching')\n"
        "          and m != 'orchestrator']\n"
        "assert not heavy and not others, (heavy, others)\n"
    )
    # -S: no site-packages and so no editable-install hook; numpy's folder is added by hand.
    numpy_home = str(Path(np.__file__).parent.parent)
    out = subprocess.run([sys.executable, "-I", "-S", "-c", script, str(archive), numpy_home],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "2"
