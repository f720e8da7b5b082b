"""What ``orch pull`` does with each file the target lists, decided from the two sides' sizes and hashes (pure).

    local = {"checkpoints/a.pt": Local(size=10, sha256="…"), "train.log": Local(part=4096)}
    items = plan(manifest["files"], local, force=False)
    [i for i in items if i.action == "conflict"]   # refused without --force: nothing is written

Actions: ``same`` (here already, byte for byte: nothing sent), ``new``, ``resume`` (a ``.part`` a cut pull
left: only the rest is sent), ``replace`` (differs here, and ``force``), ``conflict`` (differs here).
A file here whose hash is unknown on either side and whose size matches is ``unknown``: the caller hashes
it (here, or asks the target) and plans again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Local:
    """A file's state here: ``kind`` "file", "dir" (a folder in the way: never replaced), "other" (a link, a
    device: replaced only with ``force``), or None (absent)."""

    kind: str | None = None
    size: int = 0
    sha256: str | None = None
    part: int | None = None  # bytes a cut pull left in its .part file


@dataclass(frozen=True)
class Item:
    key: str
    size: int
    action: str
    offset: int = 0  # where the transfer starts (a resumed .part's length)
    sha256: str | None = None  # the target's hash, when it was listed
    entry: str | None = None  # the trash entry a clean moved the run's own checkpoint into

    @property
    def sends(self) -> int:
        """Bytes this item will ask for (the file as listed, less what is kept)."""
        return 0 if self.action in ("same", "conflict", "unknown") else self.size - self.offset


SENDS = ("new", "resume", "replace")


def decide(remote: dict, local: Local, force: bool) -> Item:
    item = _decide(remote, local, force)
    return replace(item, entry=remote["entry"]) if remote.get("entry") else item


def _decide(remote: dict, local: Local, force: bool) -> Item:
    key, size, sha = remote["key"], int(remote["size"]), remote.get("sha256")
    if local.kind == "file":
        if local.size == size:
            if sha is None or local.sha256 is None:
                return Item(key, size, "unknown", sha256=sha)
            if local.sha256 == sha:
                return Item(key, size, "same", sha256=sha)
        return Item(key, size, "replace" if force else "conflict", sha256=sha)
    if local.kind == "dir":
        return Item(key, size, "conflict", sha256=sha)
    if local.kind is not None:
        return Item(key, size, "replace" if force else "conflict", sha256=sha)
    if local.part is not None and 0 < local.part <= size:
        return Item(key, size, "resume", offset=local.part, sha256=sha)
    return Item(key, size, "new", sha256=sha)


def plan(remote: list[dict], local: dict[str, Local], *, force: bool = False) -> list[Item]:
    return [decide(r, local.get(r["key"], Local()), force) for r in remote]


def unknown(items: list[Item]) -> list[str]:
    return [i.key for i in items if i.action == "unknown"]


def summary(items: list[Item]) -> dict:
    """Counts and bytes by action, for the report and ``--dry-run``."""
    out: dict = {"files": len(items), "bytes": sum(i.sends for i in items)}
    for item in items:
        out[item.action] = out.get(item.action, 0) + 1
    return out
