"""A revision: the project's sources as a content-addressed manifest.

The files of ``[project] sources`` (which ones they are: ``sources.py``) are hashed into a manifest; the
revision id is the hash of that manifest (``agent.protocol.manifest_id``), so the same tree always has the
same id and a changed byte gives a new one. Hashes are cached by (size, mtime) in ``.orch/hashes.json`` so an
unchanged 50 MB tree is not re-read on every deploy.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ..agent.protocol import manifest_id
from ..files import atomic_write
from .meter import Count, Meter, silent
from .sources import LeftOut, collect

MAX_DIFF = 1 << 20
PARALLEL_BYTES = 64 << 20


@dataclass
class Revision:
    id: str
    files: list[dict]  # {"path", "sha256", "mode", "size"}
    root: Path
    git_commit: str | None = None
    git_dirty: bool | None = None
    git_diff: str | None = None
    local_paths: dict[str, Path] = field(default_factory=dict)
    left_out: list[LeftOut] = field(default_factory=list)  # under named folders, with the rule that dropped each

    @property
    def size(self) -> int:
        return sum(f["size"] for f in self.files)


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.decode("utf-8", "replace") if out.returncode == 0 else None


def _hash_file(path: Path, bar: Count) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
            bar.advance(len(chunk))
    bar.advance(0, files=1)
    return h.hexdigest()


def _hash_all(paths: list[Path], total: int, shown: Count) -> dict[Path, str]:
    """The files' hashes; a big set is hashed on several cores (hashlib releases the GIL)."""
    if len(paths) < 2 or total < PARALLEL_BYTES:
        return {path: _hash_file(path, shown) for path in paths}
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1))) as pool:
        return dict(zip(paths, pool.map(lambda path: _hash_file(path, shown), paths)))


def build(project_dir: Path, sources: list[str], cache_dir: Path | None = None, *,
          follow_symlinks: list[str] | tuple = (), progress: Meter | None = None) -> Revision:
    """Hash the project's sources into a revision (no network, no writes except the hash cache).

    A symlink's content is sent under the link's path. The bytes hashed are counted on ``progress``.
    """
    cache_file = cache_dir / "hashes.json" if cache_dir else None
    try:
        cache = json.loads(cache_file.read_text()) if cache_file and cache_file.is_file() else {}
    except (OSError, ValueError):
        cache = {}
    files, local_paths, new_cache = [], {}, {}
    chosen = collect(project_dir, sources, follow_symlinks)
    found = [(rel, path, path.stat()) for rel, path in chosen.files.items()]
    fresh = [(path, st.st_size) for rel, path, st in found
             if not cache.get(rel, {}).get(f"{st.st_size}:{st.st_mtime_ns}")]
    with (progress or silent)("hashing", sum(n for _p, n in fresh), len(fresh), keep=False) as shown:
        hashed = _hash_all([p for p, _n in fresh], sum(n for _p, n in fresh), shown)
    for rel, path, st in found:
        key = f"{st.st_size}:{st.st_mtime_ns}"
        sha = hashed.get(path) or cache[rel][key]
        new_cache[rel] = {key: sha}
        mode = 0o755 if st.st_mode & 0o111 else 0o644
        files.append({"path": rel, "sha256": sha, "mode": mode, "size": st.st_size})
        local_paths[rel] = path
    if cache_file and new_cache != cache:
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(cache_file, json.dumps(new_cache), durable=False)  # lost in a power cut: files hashed again
        except OSError:
            pass  # the cache only saves time
    rev = Revision(manifest_id(files), files, project_dir, local_paths=local_paths, left_out=chosen.left_out)
    # one git call for the commit and whether the sources differ from it: "# branch.oid <sha>", then a line per change
    status = _git(project_dir, "status", "--porcelain=v2", "--branch", "--", *sources) or ""
    oid = next((line.split()[2] for line in status.splitlines() if line.startswith("# branch.oid ")), None)
    if oid and oid != "(initial)":
        rev.git_commit = oid
        rev.git_dirty = any(line and not line.startswith("#") for line in status.splitlines())
        if rev.git_dirty:
            diff = _git(project_dir, "diff", "HEAD", "--", *sources) or ""
            rev.git_diff = diff[:MAX_DIFF]
    return rev
