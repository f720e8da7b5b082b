"""``layout.write_all``: a run's start files written together, each as ``write_atomic`` writes one, their fsyncs at
once (a loaded target waits for the disk and then a CPU once, not once per file)."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from orchestrator.agent import layout
from orchestrator.agent.layout import write_all


def test_each_file_is_written_with_its_mode_and_renamed_in_order_once_all_are_on_disk(tmp_path, monkeypatch):
    files = [(str(tmp_path / "run" / "batching.json"), b'{"a": 1}\n', 0o644),
             (str(tmp_path / "run" / "experiment.json"), b"{}\n", 0o644),
             (str(tmp_path / "run" / "launch-env.json"), b'{"env": {}}\n', 0o600),
             (str(tmp_path / "run" / "launch.json"), b'{"argv": ["true"]}\n', 0o644)]
    real_fsync, real_replace = os.fsync, os.replace
    barrier = threading.Barrier(len(files), timeout=10)  # every fsync in flight at once, or this one times out
    events: list[str] = []

    def fsync(fd: int) -> None:
        barrier.wait()  # one after the other (the old way) never gets all four here: BrokenBarrierError
        real_fsync(fd)
        events.append("fsync")

    def replace(src: str, dst: str) -> None:
        events.append(os.path.basename(dst))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    write_all(files)
    assert events == ["fsync"] * 4 + ["batching.json", "experiment.json", "launch-env.json", "launch.json"]
    for path, data, mode in files:
        assert open(path, "rb").read() == data
        assert stat.S_IMODE(os.stat(path).st_mode) == mode
    assert sorted(os.listdir(tmp_path / "run")) == sorted(os.path.basename(p) for p, *_ in files)  # no temporary


def test_a_failed_fsync_renames_none_and_leaves_no_temporary(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    (run / "experiment.json").write_bytes(b"old\n")
    real_fsync = os.fsync
    failing = []

    def fsync(fd: int) -> None:  # the disk fails the new experiment.json's data
        with open(f"/proc/self/fd/{fd}", "rb") as fh:
            if fh.read() == b"new\n":
                failing.append(fd)
                raise OSError(5, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError, match="Input/output"):
        write_all([(str(run / "batching.json"), b"{}\n", 0o644), (str(run / "experiment.json"), b"new\n", 0o644),
                   (str(run / "launch.json"), b"{}\n", 0o644)])
    assert failing and sorted(os.listdir(run)) == ["experiment.json"]
    assert (run / "experiment.json").read_bytes() == b"old\n"  # the old file, whole


def test_one_file_is_written_in_place_with_no_thread(tmp_path, monkeypatch):
    # write_atomic is write_all of one file: every record the agent writes goes this way, and starts no thread
    def no_thread(*_a, **_k):
        raise AssertionError("a thread for one file")

    monkeypatch.setattr(threading, "Thread", no_thread)
    path = tmp_path / "deep" / "er" / "exit.json"
    layout.write_json(str(path), {"b": [1, 2], "a": {"z": None, "é": "ü"}})
    assert path.read_bytes() == layout.json_bytes({"a": {"z": None, "é": "ü"}, "b": [1, 2]})
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644 and os.listdir(path.parent) == ["exit.json"]
    layout.write_atomic(str(path), b"second\n", 0o600)
    assert path.read_bytes() == b"second\n" and stat.S_IMODE(os.stat(path).st_mode) == 0o600
