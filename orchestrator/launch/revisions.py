"""A revision: the project's sources as a content-addressed manifest.

The files of ``[project] sources`` (which ones they are: ``sources.py``) are hashed into a manifest; the
revision id is the hash of that manifest (``agent.protocol.manifest_id``), so the same tree always has the
same id and a changed byte gives a new one. Hashes are cached by (size, mtime) in ``.orch/hashes.json`` so an
unchanged 50 MB tree is not re-read on every deploy.

A big tree whose hashes are not cached (a first push) can be built *pending* (``defer``): those files are not
read here but hashed while they are sent (``push.py``), each with a ``key`` (its path, size and mtime) that names
its partial copy on the target, and the revision's id is known once the push has ``settle``d every hash.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ..agent.protocol import manifest_id
from ..files import atomic_write, sha256_file
from .meter import Count, Meter, silent
from .sources import LeftOut, collect

MAX_DIFF = 1 << 20
PARALLEL_BYTES = 64 << 20
PENDING = "pending"  # what a plan names a pending revision by until its push has hashed it


class GitLookup:
    """The commit the sources are at and whether they differ from it: one ``git status`` started now and read when
    asked (a deploy asks once the target has answered its probe, so git runs meanwhile), then ``git diff`` if they
    differ. A folder with no ``.git`` in it or above it (and no ``GIT_DIR``) is in no repository: git is not run."""

    def __init__(self, root: Path, sources: list[str]) -> None:
        self.root, self.sources = root, sources
        self.facts: tuple[str | None, bool | None, str | None] | None = None
        self.proc: subprocess.Popen | None = None
        if not in_repository(root):
            self.facts = (None, None, None)
            return
        try:
            self.proc = subprocess.Popen(["git", "-C", str(root), "status", "--porcelain=v2", "--branch", "--",
                                          *sources], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL)
        except OSError:
            self.facts = (None, None, None)

    def get(self) -> tuple[str | None, bool | None, str | None]:
        """(commit, dirty, diff): Nones outside a repository, or where git is missing or fails."""
        if self.facts is None:
            assert self.proc is not None
            try:
                out, _ = self.proc.communicate(timeout=30)
                status = out.decode("utf-8", "replace") if self.proc.returncode == 0 else ""
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.communicate()
                status = ""
            # "# branch.oid <sha>", then a line per change
            oid = next((line.split()[2] for line in status.splitlines() if line.startswith("# branch.oid ")), None)
            if not oid or oid == "(initial)":
                self.facts = (None, None, None)
            else:
                dirty = any(line and not line.startswith("#") for line in status.splitlines())
                diff = (_git(self.root, "diff", "HEAD", "--", *self.sources) or "")[:MAX_DIFF] if dirty else None
                self.facts = (oid, dirty, diff)
        return self.facts


def in_repository(folder: Path) -> bool:
    """Whether git could find a repository for ``folder``: a ``.git`` (folder or file) in it or above, or GIT_DIR."""
    if os.environ.get("GIT_DIR"):
        return True
    here = os.path.abspath(folder)
    while True:
        if os.path.lexists(os.path.join(here, ".git")):
            return True
        up = os.path.dirname(here)
        if up == here:
            return False
        here = up


@dataclass
class Revision:
    id: str | None
    files: list[dict]  # {"path", "sha256", "mode", "size"}
    root: Path
    local_paths: dict[str, Path] = field(default_factory=dict)
    left_out: list[LeftOut] = field(default_factory=list)  # under named folders, with the rule that dropped each
    cache_file: Path | None = None
    cache_keys: dict[str, str] = field(default_factory=dict)  # path -> "size:mtime_ns", as the hash cache keys it
    git: GitLookup | None = None  # the commit, whether the sources differ from it, and how: ``git_*`` below
    fresh: frozenset[str] = frozenset()  # the paths hashed by this build (not in the hash cache: changed since)

    @property
    def git_commit(self) -> str | None:
        return self.git.get()[0] if self.git is not None else None

    @property
    def git_dirty(self) -> bool | None:
        return self.git.get()[1] if self.git is not None else None

    @property
    def git_diff(self) -> str | None:
        return self.git.get()[2] if self.git is not None else None

    @property
    def size(self) -> int:
        return sum(f["size"] for f in self.files)

    @property
    def pending(self) -> list[dict]:
        """The files not hashed yet (``sha256`` None, a ``key`` instead); the id is None while there are any."""
        return [f for f in self.files if f["sha256"] is None]

    def settle(self, hashes: dict[str, str]) -> None:
        """Take the pending files' hashes (path -> sha256): the id is known from now on, and cached hashes kept."""
        for f in self.pending:
            f["sha256"] = hashes[f["path"]]
            del f["key"]
        self.id = manifest_id(self.files)
        _save_cache(self)

    def hash_pending(self, progress: Meter | None = None, paths: set[str] | None = None) -> None:
        """Hash pending files here (all, or those of ``paths``), for a caller that needs their hashes first."""
        todo = [f for f in self.pending if paths is None or f["path"] in paths]
        total = sum(f["size"] for f in todo)
        with (progress or silent)("hashing", total, len(todo), keep=False) as shown:
            hashed = _hash_all([self.local_paths[f["path"]] for f in todo], total, shown)
        for f in todo:
            f["sha256"] = hashed[self.local_paths[f["path"]]]
            del f["key"]
        if not self.pending:
            self.settle({})


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.decode("utf-8", "replace") if out.returncode == 0 else None


def _hash_file(path: Path, bar: Count) -> str:
    sha = sha256_file(path, advance=bar.advance)
    bar.advance(0, files=1)
    return sha


def _hash_all(paths: list[Path], total: int, shown: Count) -> dict[Path, str]:
    """The files' hashes; a big set is hashed on several cores (hashlib releases the GIL)."""
    if len(paths) < 2 or total < PARALLEL_BYTES:
        return {path: _hash_file(path, shown) for path in paths}
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1))) as pool:
        return dict(zip(paths, pool.map(lambda path: _hash_file(path, shown), paths)))


def file_key(rel: str, size: int, mtime_ns: int) -> str:
    """The name of a pending file's partial copy on the target: the same file unchanged, the same key."""
    return hashlib.sha256(f"{size}:{mtime_ns}:{rel}".encode()).hexdigest()[:32]


def _save_cache(rev: Revision, old: dict | None = None) -> None:
    """The revision's hashes into its cache file, unless it holds them already (``old``: its content, when read)."""
    if rev.cache_file is None:
        return
    new_cache = {f["path"]: {rev.cache_keys[f["path"]]: f["sha256"]} for f in rev.files}
    if old is None:
        try:
            old = json.loads(rev.cache_file.read_text()) if rev.cache_file.is_file() else {}
        except (OSError, ValueError):
            old = {}
    if new_cache != old:
        try:
            rev.cache_file.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(rev.cache_file, json.dumps(new_cache), durable=False)  # lost in a power cut: hashed again
        except OSError:
            pass  # the cache only saves time


def build(project_dir: Path, sources: list[str], cache_dir: Path | None = None, *,
          follow_symlinks: list[str] | tuple = (), progress: Meter | None = None,
          defer: int | None = None) -> Revision:
    """Hash the project's sources into a revision (no network, no writes except the hash cache).

    A symlink's content is sent under the link's path. The bytes hashed are counted on ``progress``. With
    ``defer``, when the files whose hashes are not cached hold at least that many bytes, they are left pending
    (see the module docstring) and the revision's id is None until ``settle``.
    """
    cache_file = cache_dir / "hashes.json" if cache_dir else None
    git = GitLookup(project_dir, sources)  # runs while the sources are hashed and the target is asked
    try:
        cache = json.loads(cache_file.read_text()) if cache_file and cache_file.is_file() else {}
    except (OSError, ValueError):
        cache = {}
    files, local_paths, keys = [], {}, {}
    chosen = collect(project_dir, sources, follow_symlinks)
    found = [(rel, path, path.stat()) for rel, path in chosen.files.items()]
    fresh = [(path, st.st_size) for rel, path, st in found
             if not cache.get(rel, {}).get(f"{st.st_size}:{st.st_mtime_ns}")]
    later = defer is not None and sum(n for _p, n in fresh) >= defer
    hashed: dict[Path, str] = {}
    if not later:
        with (progress or silent)("hashing", sum(n for _p, n in fresh), len(fresh), keep=False) as shown:
            hashed = _hash_all([p for p, _n in fresh], sum(n for _p, n in fresh), shown)
    for rel, path, st in found:
        keys[rel] = key = f"{st.st_size}:{st.st_mtime_ns}"
        sha = hashed.get(path) or cache.get(rel, {}).get(key)
        mode = 0o755 if st.st_mode & 0o111 else 0o644
        files.append({"path": rel, "sha256": sha, "mode": mode, "size": st.st_size}
                     | ({} if sha else {"key": file_key(rel, st.st_size, st.st_mtime_ns)}))
        local_paths[rel] = path
    rev = Revision(None if later else manifest_id(files), files, project_dir, local_paths=local_paths,
                   left_out=chosen.left_out, cache_file=cache_file, cache_keys=keys, git=git,
                   fresh=frozenset(rel for rel, path, _st in found if path in hashed))
    if not later:
        _save_cache(rev, cache)
    return rev
