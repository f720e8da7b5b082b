"""Progress bars for long transfers and hashing: on a terminal's stderr only, never in ``--json`` or a pipe."""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

from ..launch.meter import Meter

#: below this, a bar would only flicker
MIN_BYTES = 4 << 20


class Bar:
    """Counts bytes and files done; this base class shows nothing."""

    def advance(self, nbytes: int, files: int = 0) -> None:
        """``nbytes`` more bytes, ``files`` more files done."""


class _RichBar(Bar):
    def __init__(self, progress: Any, task: Any, files: int) -> None:
        import threading

        self.progress, self.task, self.files, self.done = progress, task, files, 0
        self.lock = threading.Lock()  # files may be hashed on several threads

    def advance(self, nbytes: int, files: int = 0) -> None:
        with self.lock:
            self.done += files
            self.progress.update(self.task, advance=nbytes, files=f"{self.done}/{self.files} files")


def enabled(as_json: bool = False) -> bool:
    return not as_json and sys.stderr.isatty()


def meter(as_json: bool = False) -> Meter | None:
    """What a launch counts its hashing and push on: bars on a terminal, nothing in ``--json`` or a pipe."""
    if not enabled(as_json):
        return None
    return lambda label, total, files, keep=True: bar(label, total, files, True, keep=keep)


@contextlib.contextmanager
def bar(label: str, total: int, files: int, show: bool, *, keep: bool = True) -> Iterator[Bar]:
    """A bar for ``total`` bytes in ``files`` files when ``show`` and the work is big enough to watch."""
    if not show or total < MIN_BYTES:
        yield Bar()
        return
    from rich.console import Console
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                               TransferSpeedColumn)

    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
               TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[files]}"))
    with Progress(*columns, console=Console(stderr=True), transient=not keep) as progress:
        task = progress.add_task(label, total=total, files=f"0/{files} files")
        yield _RichBar(progress, task, files)
