"""The suite's one way to wait for something: poll a check until it holds, where "not there yet" is "not yet".

A run's log, pid file or record appears some time after the command that starts it returns, and a JSON file may be
read while it is still being written. A check that reads such a file raises ``FileNotFoundError`` (or
``json.JSONDecodeError``) until then: that is one more "not yet", never the end of the wait. Any other exception is
a real failure and ends the wait at once.

    wait_for(lambda: "step=10 " in (run_dir / "train.log").read_text(), what="step 10")
"""

from __future__ import annotations

import json
import time
from typing import Callable, TypeVar

T = TypeVar("T")

NOT_YET = (FileNotFoundError, NotADirectoryError, json.JSONDecodeError)


def wait_for(check: Callable[[], T], timeout: float = 30.0, what: str = "condition", every: float = 0.05,
             describe: Callable[[], str] | None = None) -> T:
    """Poll ``check`` every ``every`` seconds until it returns something true, and return that; after ``timeout``
    seconds fail the test, saying what was awaited, the last "not yet" error and, if given, ``describe()``."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            result = check()
        except NOT_YET as exc:
            result, last = None, exc  # type: ignore[assignment]
        if result:
            return result
        if time.monotonic() >= deadline:
            detail = f" (last: {type(last).__name__}: {last})" if last is not None else ""
            if describe is not None:
                detail += f"\n{describe()}"
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{detail}")
        time.sleep(every)
