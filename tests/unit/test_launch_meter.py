"""A launch counts its hashing and push on a meter it is given; it never draws on the screen itself."""

from __future__ import annotations

import contextlib
from pathlib import Path

from orchestrator.launch import revisions
from tests.unit.test_architecture import PKG, imports, rel


def test_launch_knows_no_screen():
    for path in (PKG / "launch").glob("*.py"):
        for name in imports(path):
            assert not name.startswith(("..cli", "orchestrator.cli", "rich", "typer")), f"{rel(path)} imports {name}"


class Recorded:
    def __init__(self) -> None:
        self.opened: list[tuple] = []
        self.bytes = self.files = 0

    @contextlib.contextmanager
    def __call__(self, label: str, total: int, files: int, *, keep: bool = True):
        self.opened.append((label, total, files, keep))
        yield self

    def advance(self, nbytes: int, files: int = 0) -> None:
        self.bytes += nbytes
        self.files += files


def test_hashing_counts_every_new_byte_on_the_meter(tmp_path: Path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "data.bin").write_bytes(b"x" * 3000)
    meter = Recorded()
    rev = revisions.build(tmp_path, ["train.py", "data.bin"], tmp_path / ".orch", progress=meter)
    assert meter.opened == [("hashing", rev.size, 2, False)]
    assert (meter.bytes, meter.files) == (rev.size, 2)
    again = Recorded()  # unchanged files come from the hash cache: nothing to count
    assert revisions.build(tmp_path, ["train.py", "data.bin"], tmp_path / ".orch", progress=again).id == rev.id
    assert again.opened == [("hashing", 0, 0, False)] and again.bytes == 0
