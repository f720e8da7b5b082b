"""How a long step of a launch (hashing the sources, pushing blobs) tells its progress, without a screen.

    with meter("pushing", total_bytes, files) as count:
        count.advance(nbytes)        # more bytes done
        count.advance(0, files=1)    # one more file done

A ``Meter`` opens such a count for a step; ``keep=False`` says the finished count need not stay in
view (hashing is forgotten once it is done). ``silent`` counts nothing; the CLI hands the launch a meter
that draws a bar on a terminal (``cli/progress.meter``).
"""

from __future__ import annotations

import contextlib
from typing import Callable, ContextManager, Iterator, Protocol


class Count(Protocol):
    def advance(self, nbytes: int, files: int = 0) -> None:
        """``nbytes`` more bytes, ``files`` more files done."""


Meter = Callable[..., ContextManager[Count]]  # meter(label, total_bytes, files, *, keep=True)


class _Nothing:
    def advance(self, nbytes: int, files: int = 0) -> None:
        pass


@contextlib.contextmanager
def silent(label: str, total: int, files: int, *, keep: bool = True) -> Iterator[Count]:
    yield _Nothing()
