"""Which files make a revision: the named sources, the ignore files inside named folders, and symlinks.

- A path named in ``[project] sources`` is always sent, whatever the ignore files say.
- Inside a named folder each entry is checked git's way: the ignore files of its folder and of every folder
  above it up to the project, the deepest file first and its last matching line deciding; ``!`` re-includes; an
  ignored folder is not entered. ``.orchignore`` is asked first, then the built-in set (``__pycache__``, ``*.pyc``,
  ``.venv``, ``.orchignore``), then ``.gitignore``; whether the project is a git repository changes nothing.
  ``.git`` and ``.orch`` are never sent. The patterns are parsed by pathspec.
- A symlink is sent as what it points to, under the link's path, when that lies inside the project folder (or
  the link is listed in ``[project] follow_symlinks``). One that leads outside, dangles or loops is refused.

Nothing here prints: the left-out paths come back with the rule that dropped each, e.g. for nanoGPT with
``sources = ["train.py", "data"]``: ``LeftOut("data/shakespeare_char/val.bin", ".gitignore", 6, "*.bin")``.
"""

from __future__ import annotations

import errno
import functools
import os
import posixpath
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputError

NEVER_SENT = (".git", ".orch")  # version control and orch's own state (secrets.env): no rule re-includes them
BUILT_IN = ("__pycache__/", "*.pyc", ".venv", ".orchignore")
BUILT_IN_ORIGIN = "built-in"
IGNORE_FILES = (".orchignore", ".gitignore")  # asked in this order, the built-in set between them
ORCH_OWN = "orch-pull/"  # where orch pull copies runs' files (orch init ignores it): its leaving out is no news


@dataclass(frozen=True)
class LeftOut:
    """A path under a named folder that is not sent; a folder's path ends with ``/``."""

    path: str
    origin: str  # the ignore file, relative to the project ("data/.gitignore"), or "built-in"
    line: int  # 0 for the built-in set and for what is not a regular file
    pattern: str

    @property
    def rule(self) -> str:
        where = self.origin if not self.line else f"{self.origin} line {self.line}"
        return f"{where}: {self.pattern}"

    @property
    def by_user(self) -> bool:
        """Dropped by one of the project's ignore files (or not a regular file), not by the built-in set."""
        return self.origin != BUILT_IN_ORIGIN

    def public(self) -> dict:
        return {"path": self.path, "rule": self.rule}


@dataclass
class Selection:
    files: dict[str, Path]  # the revision's relative path -> the file whose content is sent for it
    left_out: list[LeftOut] = field(default_factory=list)


@dataclass(frozen=True)
class _Rules:
    """The patterns of one ignore file, applying to the entries under its folder ``base``."""

    origin: str
    base: str
    patterns: tuple  # (line number, pathspec pattern), comments and blank lines dropped

    def decide(self, rel: str, is_dir: bool) -> tuple[bool, int, str] | None:
        """(ignored, line, pattern) of the last line matching the entry itself, or None."""
        sub = rel[len(self.base) + 1:] if self.base else rel
        path = sub + "/" if is_dir else sub
        for line, pat in reversed(self.patterns):
            if pat.regex.fullmatch(path):  # the entry itself, not one of its folders: that was entered already
                return bool(pat.include), line, pat.pattern
        return None


def _compile(lines: list[str], origin: str, base: str) -> _Rules:
    from pathspec import GitIgnoreSpec

    out = []
    for number, line in enumerate(lines, 1):
        try:
            spec = GitIgnoreSpec.from_lines([line])
        except ValueError as exc:
            raise InputError(f"{origin} line {number}: {line!r} is not a valid pattern ({exc})",
                             hint=f"fix or remove that line of {origin}") from None
        out += [(number, p) for p in spec.patterns if p.include is not None]
    return _Rules(origin, base, tuple(out))


@functools.lru_cache(maxsize=1)
def _built_in() -> _Rules:
    rules = _compile(list(BUILT_IN), BUILT_IN_ORIGIN, "")
    return _Rules(BUILT_IN_ORIGIN, "", tuple((0, p) for _n, p in rules.patterns))


def _inside(path: str, folders: tuple[str, ...]) -> bool:
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


def _normal(src: str) -> str:
    rel = posixpath.normpath(src.replace(os.sep, "/"))
    return "" if rel == "." else rel


class _Walk:
    def __init__(self, project_dir: Path, follow: list[str]) -> None:
        self.root = os.path.realpath(project_dir)
        self.follow = {_normal(f) for f in follow}
        self.files: dict[str, Path] = {}
        self.left_out: list[LeftOut] = []
        self.folders: dict[str, str] = {"": self.root}  # relative folder -> where its content really is
        self.rules: dict[str, tuple[list[_Rules], list[_Rules]]] = {}
        self.chains: dict[str, list[_Rules]] = {}

    # -- ignore files

    def _own(self, rel_dir: str, name: str, allowed: tuple[str, ...]) -> list[_Rules]:
        path = os.path.join(self.folders[rel_dir], name)
        if not os.path.lexists(path):
            return []
        origin = f"{rel_dir}/{name}" if rel_dir else name
        if os.path.islink(path):
            path = self._through_link(origin, path, allowed)
        if not os.path.isfile(path):
            return []
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                lines = fh.read().splitlines()
        except OSError as exc:
            raise InputError(f"cannot read {origin}: {exc.strerror}", hint="fix its permissions") from None
        return [_compile(lines, origin, rel_dir)]

    def _chain(self, rel_dir: str, allowed: tuple[str, ...]) -> list[_Rules]:
        """Every ignore file that applies to the entries of ``rel_dir``, in the order they are asked."""
        if rel_dir not in self.chains:
            orch, git = self._layers(rel_dir, allowed)
            self.chains[rel_dir] = orch + [_built_in()] + git
        return self.chains[rel_dir]

    def _layers(self, rel_dir: str, allowed: tuple[str, ...]) -> tuple[list[_Rules], list[_Rules]]:
        """(.orchignore files, .gitignore files) from ``rel_dir`` up to the project, the deepest first."""
        if rel_dir not in self.rules:
            orch, git = self._layers(posixpath.dirname(rel_dir), allowed) if rel_dir else ([], [])
            self.rules[rel_dir] = (self._own(rel_dir, IGNORE_FILES[0], allowed) + orch,
                                   self._own(rel_dir, IGNORE_FILES[1], allowed) + git)
        return self.rules[rel_dir]

    def _ignored(self, rel: str, is_dir: bool, rel_dir: str, allowed: tuple[str, ...]) -> LeftOut | None:
        for rules in self._chain(rel_dir, allowed):
            decided = rules.decide(rel, is_dir)
            if decided is not None:
                ignored, line, pattern = decided
                return LeftOut(rel + "/" if is_dir else rel, rules.origin, line, pattern) if ignored else None
        return None

    # -- symlinks

    def _through_link(self, rel: str, path: str, allowed: tuple[str, ...], named: bool = False) -> str:
        """Where the symlink at ``rel`` really leads; refused when that is outside the project and not allowed."""
        points = os.readlink(path)
        drop = "remove it from [project] sources" if named else f"leave it out with a line {rel} in .orchignore"
        try:
            os.stat(path)
        except OSError as exc:
            reason = ("it loops (a chain of links that leads back to itself)" if exc.errno == errno.ELOOP
                      else "it dangles: nothing is there" if exc.errno == errno.ENOENT else exc.strerror)
            raise InputError(f"symlink {rel} -> {points} cannot be sent: {reason}",
                             hint=f"fix or remove the link, or {drop}") from None
        real = os.path.realpath(path)
        if _inside(real, allowed) or rel in self.follow:
            return real
        raise InputError(
            f"symlink {rel} -> {points} points outside the project folder ({real}): orch does not send files "
            "from outside the project",
            hint=f'to send what it points to, list it in orch.toml: [project] follow_symlinks = ["{rel}"]; '
                 f"or {drop}")

    # -- the walk

    def named(self, src: str) -> None:
        rel = _normal(src)
        parts = rel.split("/") if rel else []
        if rel.startswith("../") or rel == ".." or posixpath.isabs(rel):
            raise InputError(f"source {src!r} in [project] sources is outside the project folder",
                             hint="list paths inside the folder of orch.toml")
        if any(p in NEVER_SENT for p in parts):
            raise InputError(f"source {src!r} in [project] sources is inside .git or .orch, which are never sent",
                             hint="remove it from [project] sources")
        real, allowed = self.root, (self.root,)
        for i, part in enumerate(parts):
            here = "/".join(parts[:i + 1])
            path = os.path.join(real, part)
            if not os.path.lexists(path):
                raise InputError(f"source {src!r} listed in [project] sources does not exist in {self.root}",
                                 hint="fix [project] sources in orch.toml")
            if os.path.islink(path):
                real = self._through_link(here, path, allowed, named=True)
                if not _inside(real, allowed):
                    allowed += (real,)
            else:
                real = path
            if i < len(parts) - 1:
                self.folders[here] = real
        if os.path.isdir(real):
            self.folders[rel] = real
            self._walk(rel, real, allowed, (real,))
        elif os.path.isfile(real):
            self.files[rel] = Path(real)
        else:
            raise InputError(f"source {src!r} in [project] sources is not a regular file or folder",
                             hint="remove it from [project] sources")

    def _walk(self, rel_dir: str, real_dir: str, allowed: tuple[str, ...], chain: tuple[str, ...]) -> None:
        try:
            with os.scandir(real_dir) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            raise InputError(f"cannot read the folder {rel_dir or '.'} of [project] sources: {exc.strerror}",
                             hint=f"fix its permissions, or leave it out with a line {rel_dir}/ in .orchignore"
                             ) from None
        for entry in entries:
            if entry.name in NEVER_SENT:
                continue
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            link = entry.is_symlink()
            is_dir = os.path.isdir(entry.path) if link else entry.is_dir(follow_symlinks=False)
            dropped = self._ignored(rel, is_dir, rel_dir, allowed)
            if dropped is not None:
                self.left_out.append(dropped)
                continue
            real, inner = entry.path, allowed
            if link:
                real = self._through_link(rel, entry.path, allowed)
                if not _inside(real, allowed):
                    inner = allowed + (real,)
            if is_dir:
                if link and any(_inside(c, (real,)) for c in chain):
                    raise InputError(f"symlink {rel} -> {os.readlink(entry.path)} leads back into a folder that "
                                     "holds it: sending it would never end (a loop)",
                                     hint=f"remove the link, or leave it out with a line {rel} in .orchignore")
                self.folders[rel] = real
                self._walk(rel, real, inner, chain + (real,))
            elif os.path.isfile(real):
                self.files[rel] = Path(real)
            else:
                self.left_out.append(LeftOut(rel, "not a regular file", 0, "fifo, socket or device"))


def collect(project_dir: Path, sources: list[str], follow_symlinks: list[str] | tuple = ()) -> Selection:
    """The files of a revision and what the ignore rules left out (see the module docstring)."""
    walk = _Walk(project_dir, list(follow_symlinks))
    for name in sorted(walk.follow):
        if not os.path.islink(os.path.join(walk.root, name)):
            raise InputError(f"[project] follow_symlinks lists {name!r}, which is not a symlink in the project",
                             hint="list the paths of symlinks, relative to orch.toml, or remove the entry")
    for src in sources:
        walk.named(src)
    if not walk.files:
        raise InputError("[project] sources select no files (all ignored or empty)",
                         hint="check [project] sources, .gitignore and .orchignore")
    left_out = [d for d in walk.left_out if d.path not in walk.files]
    return Selection(dict(sorted(walk.files.items())), left_out)


def left_out_warning(left_out: list[LeftOut], shown: int = 5) -> list[str]:
    """The lines that tell a deploy what its ignore files left out (the built-in set and orch's own ``orch-pull/``
    are not worth a warning)."""
    told = [d for d in left_out if d.by_user and not d.path.startswith(ORCH_OWN)]
    if not told:
        return []
    lines = [f"warning: {len(told)} path(s) under [project] sources left out of the revision:"]
    lines += [f"  {d.path} ({d.rule})" for d in told[:shown]]
    if len(told) > shown:
        lines.append(f"  ... and {len(told) - shown} more")
    example = next((d.pattern for d in told if d.line), "PATTERN").lstrip("!")
    lines.append(f"hint: to send one, name it in [project] sources, or add a line !{example} to .orchignore")
    return lines
