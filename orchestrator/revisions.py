"""A revision: the project's sources as a content-addressed manifest.

The files named by ``[project] sources`` (minus what ``.gitignore`` and ``.orchignore`` exclude) are
hashed into a manifest; the revision id is the hash of that manifest (``agent.protocol.manifest_id``),
so the same tree always has the same id and a changed byte gives a new one. Hashes are cached by
(size, mtime) in ``.orch/hashes.json`` so an unchanged 50 MB tree is not re-read on every deploy.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from .agent.protocol import manifest_id
from .errors import InputError
from .progress import Bar, bar

ALWAYS_IGNORED = (".git", ".orch", "__pycache__", "*.pyc", ".venv", ".orchignore")
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

    @property
    def size(self) -> int:
        return sum(f["size"] for f in self.files)


def _patterns(path: Path) -> list[str]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        line = line.strip()
        if line and not line.startswith("#") and not line.startswith("!"):
            out.append(line.rstrip("/"))
    return out


def _ignored(rel: str, patterns: list[str]) -> bool:
    parts = rel.split("/")
    for pat in patterns:
        anchored = pat.startswith("/")
        pat = pat.lstrip("/")
        if "/" in pat or anchored:
            if fnmatch.fnmatch(rel, pat) or any(fnmatch.fnmatch("/".join(parts[:i]), pat)
                                                for i in range(1, len(parts))):
                return True
        elif any(fnmatch.fnmatch(p, pat) for p in parts):
            return True
    return False


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.decode("utf-8", "replace") if out.returncode == 0 else None


def collect(project_dir: Path, sources: list[str]) -> list[str]:
    """The relative paths that make up a revision, sorted."""
    patterns = list(ALWAYS_IGNORED) + _patterns(project_dir / ".orchignore")
    git_files = None
    if _git(project_dir, "rev-parse", "--is-inside-work-tree") is not None:
        listed = _git(project_dir, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *sources)
        if listed is not None:
            git_files = {p for p in listed.split("\0") if p}
    if git_files is None:
        patterns += _patterns(project_dir / ".gitignore")
    found: set[str] = set()
    for src in sources:
        path = project_dir / src
        if not path.exists():
            raise InputError(f"source {src!r} listed in [project] sources does not exist in {project_dir}",
                             hint="fix [project] sources in orch.toml")
        if path.is_file():
            candidates = [path]
        else:
            candidates = [Path(d) / n for d, _, names in os.walk(path) for n in names]
        for file in candidates:
            rel = file.relative_to(project_dir).as_posix()
            if git_files is not None and rel not in git_files:
                continue
            if not _ignored(rel, patterns) and file.is_file():
                found.add(rel)
    if not found:
        raise InputError("[project] sources select no files (all ignored or empty)",
                         hint="check [project] sources, .gitignore and .orchignore")
    return sorted(found)


def _hash_file(path: Path, bar: Bar) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
            bar.advance(len(chunk))
    bar.advance(0, files=1)
    return h.hexdigest()


def _hash_all(paths: list[Path], total: int, shown: Bar) -> dict[Path, str]:
    """The files' hashes; a big set is hashed on several cores (hashlib releases the GIL)."""
    if len(paths) < 2 or total < PARALLEL_BYTES:
        return {path: _hash_file(path, shown) for path in paths}
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1))) as pool:
        return dict(zip(paths, pool.map(lambda path: _hash_file(path, shown), paths)))


def build(project_dir: Path, sources: list[str], cache_dir: Path | None = None, *,
          progress: bool = False) -> Revision:
    """Hash the project's sources into a revision (no network, no writes except the hash cache).

    With ``progress``, hashing more than a few MB of new or changed files shows a bar on the terminal.
    """
    cache_file = cache_dir / "hashes.json" if cache_dir else None
    try:
        cache = json.loads(cache_file.read_text()) if cache_file and cache_file.is_file() else {}
    except (OSError, ValueError):
        cache = {}
    files, local_paths, new_cache = [], {}, {}
    found = [(rel, project_dir / rel, (project_dir / rel).stat()) for rel in collect(project_dir, sources)]
    fresh = [(path, st.st_size) for rel, path, st in found
             if not cache.get(rel, {}).get(f"{st.st_size}:{st.st_mtime_ns}")]
    with bar("hashing", sum(n for _p, n in fresh), len(fresh), progress, keep=False) as shown:
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
            tmp = cache_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(new_cache))
            os.replace(tmp, cache_file)
        except OSError:
            pass  # the cache only saves time
    rev = Revision(manifest_id(files), files, project_dir, local_paths=local_paths)
    commit = _git(project_dir, "rev-parse", "HEAD")
    if commit:
        rev.git_commit = commit.strip()
        status = _git(project_dir, "status", "--porcelain", "--", *sources) or ""
        rev.git_dirty = bool(status.strip())
        if rev.git_dirty:
            diff = _git(project_dir, "diff", "HEAD", "--", *sources) or ""
            rev.git_diff = diff[:MAX_DIFF]
    return rev
