"""Test files dealt out while the groups run, so that groups sharing a selection end together.

``tests/groups.py`` gives its groups one folder (``ORCH_CLAIMS``). A group whose selection another group shares
(``local`` and ``local-b``; ``testbed`` and ``testbed-b``) collects the same tests as the other, in the same order
(heaviest file first), and runs a file only once it has claimed it: it creates the file's claim in that folder,
which only one process can do. Whichever group is free takes the next file, so no group waits on a split made
before anything ran. The next file is claimed before the last test of the current one runs, so the fixtures the
two share (module, session) are torn down only when the group has nothing left. What a group did not claim is
reported as deselected. Without ``ORCH_CLAIMS`` the groups split their files beforehand (``ORCH_LOCAL_SHARD``,
``ORCH_TESTBED_SHARD``).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Iterator

import pytest

FOLDER = "ORCH_CLAIMS"
KIND = pytest.StashKey[str]()  # which selection the claims are for: "local" or "testbed"


def folder() -> Path | None:
    value = os.environ.get(FOLDER)
    return Path(value) if value else None


def share(config: pytest.Config, kind: str, items: list[pytest.Item], first: list[Path]) -> None:
    """Order ``items`` for claiming (the files in ``first`` in that order, then the rest as collected) and mark
    the session as claiming its files."""
    rank = {path: i for i, path in enumerate(first)}
    items.sort(key=lambda item: rank.get(item.path, len(rank)))  # stable: a file's tests keep their order
    config.stash[KIND] = kind


def claim(kind: str, path: Path) -> bool:
    """True for the one process that claims ``path`` first."""
    where = folder()
    assert where is not None
    name = hashlib.sha256(f"{kind}:{path}".encode()).hexdigest()[:32]
    try:
        os.close(os.open(where / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False
    return True


def by_file(items: list[pytest.Item]) -> list[list[pytest.Item]]:
    files: list[list[pytest.Item]] = []
    for item in items:
        if files and files[-1][0].path == item.path:
            files[-1].append(item)
        else:
            files.append([item])
    return files


def claimed(kind: str, files: list[list[pytest.Item]]) -> Iterator[list[pytest.Item]]:
    for tests in files:
        if claim(kind, tests[0].path):
            yield tests


def runtestloop(session: pytest.Session) -> bool | None:
    """pytest's own loop over the tests, over the files this process claims; None where it does not claim."""
    kind = session.config.stash.get(KIND, None)
    if kind is None or folder() is None or session.config.option.collectonly:
        return None
    if session.testsfailed and not session.config.option.continue_on_collection_errors:
        raise session.Interrupted(f"{session.testsfailed} error(s) during collection")
    ran: set[int] = set()
    mine = claimed(kind, by_file(session.items))
    current = next(mine, None)
    while current is not None:
        following = None
        for i, item in enumerate(current):
            if i + 1 < len(current):
                nextitem = current[i + 1]
            else:  # claimed before the last test ends: what the two share is kept up for it
                following = next(mine, None)
                nextitem = following[0] if following else None
            ran.add(id(item))
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
            if session.shouldfail:
                raise session.Failed(session.shouldfail)
            if session.shouldstop:
                raise session.Interrupted(session.shouldstop)
        current = following
    others = [item for item in session.items if id(item) not in ran]
    if others:
        session.config.hook.pytest_deselected(items=others)
    return True
