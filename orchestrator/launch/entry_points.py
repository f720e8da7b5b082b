"""What a project's ``[project] command`` could be, read from its files (``orch init``, and a deploy's hint when
the command names a file the revision lacks); nothing is written.

A project's own say comes first: ``train.py`` or ``main.py`` at its top, then a ``[project.scripts]`` entry of its
pyproject. Else the candidates: the scripts anywhere in what a revision sends that run something when started
(an ``if __name__ == "__main__":``), and the packages with a ``__main__.py``; those a README runs first, then the
shallow ones, then those named like training. The one script at the top of the project is chosen (unless a
README runs another); among several, or below the top only, the user chooses::

    found = find(Path("minGPT"), {}, files)     # files: the revision's paths, as sources.collect selects them
    found.command                               # None: the user chooses
    found.candidates                            # ["python3 projects/chargpt/chargpt.py", "python3 mingpt/bpe.py", ...]
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

MAIN_GUARD = re.compile(r"""^if\s+__name__\s*==\s*['"]__main__['"]\s*:""", re.M)
NOT_ENTRIES = ("setup.py", "conftest.py", "noxfile.py", "fabfile.py", "manage.py", "__init__.py", "__main__.py")
NOT_HERE = {"tests", "test", "docs", "doc", "benchmarks", "site-packages", "node_modules"}  # folders of no entry
README_RUN = re.compile(r"\bpython(?:3(?:\.\d+)?)?\s+(?:-m\s+([\w.]+)|((?:\./)?[\w./-]+\.py))")
MAX_DEPTH = 4  # projects/chargpt/chargpt.py is 3 deep; a deeper script is a library's, not the project's
MAX_READ = 400  # scripts read for a __main__ guard: a few hundred reads, whatever the project's size
MAX_SHOWN = 8


@dataclass
class Found:
    command: str | list[str] | None = None  # how the entry point runs; None: the user chooses
    entry: str = ""  # what was chosen, in words: "main.py", "[project.scripts] tinylm = tinylm.cli:main"
    candidates: list[str] = field(default_factory=list)  # commands proposed, best first, when none was chosen
    env: dict[str, str] = field(default_factory=dict)
    packages: list[str] = field(default_factory=list)  # top-level packages a deeper candidate may import


def find(folder: Path, pyproject: dict, files: list[str]) -> Found:
    """The entry point of the project in ``folder`` whose revision would hold ``files`` (relative paths)."""
    found = Found()
    for name in ("train.py", "main.py"):
        if name in files or (not files and (folder / name).is_file()):
            found.command, found.entry = f"python3 {name}", name
            return found
    if _scripts_entry(folder, pyproject, found):
        return found
    ranked = _ranked(folder, files or _top_level(folder))
    top = [(cmd, path) for cmd, path in ranked if "/" not in path and cmd.startswith("python3 ")]
    if len(top) == 1 and ranked[0] == top[0]:  # the top folder's one script, unless a README runs another
        found.command, found.entry = top[0][0], f"{top[0][1]} (its if __name__ == \"__main__\")"
    else:
        found.candidates = [cmd for cmd, _ in ranked[:MAX_SHOWN]]
        found.packages = packages(files) if any("/" in path for _, path in ranked) else []
    return found


def _scripts_entry(folder: Path, pyproject: dict, found: Found) -> bool:
    scripts = (pyproject.get("project") or {}).get("scripts") or {}
    for script, target in scripts.items():
        module, _, func = str(target).partition(":")
        top = module.split(".")[0]
        if not re.fullmatch(r"[\w.]+", module) or not re.fullmatch(r"[\w.]*", func):
            continue
        if (folder / "src" / top).is_dir() and not (folder / top).is_dir():
            found.env["PYTHONPATH"] = "src"  # the run's work folder holds src/: its packages import from there
        call = f"from {module} import {func.split('.')[0]}; sys.exit({func}())" if func else f"import {module}"
        found.command = ["python3", "-c", f"import sys; {call}"]
        found.entry = f"[project.scripts] {script} = {target}"
        return True
    return False


def _top_level(folder: Path) -> list[str]:
    """The top folder's scripts, where the revision's files could not be listed."""
    return sorted(p.name for p in folder.glob("*.py"))


def _ranked(folder: Path, files: list[str]) -> list[tuple[str, str]]:
    """(command, path) of every candidate, best first."""
    names = set(files)
    mentioned = _readme_runs(folder, names)
    out: dict[str, tuple[tuple, str]] = {}
    read = 0
    for path in files:
        parts = path.split("/")
        if len(parts) > MAX_DEPTH or any(p.startswith(".") or p in NOT_HERE for p in parts[:-1]):
            continue
        name = parts[-1]
        if name == "__main__.py" and len(parts) >= 2:
            src = parts[0] == "src" and len(parts) >= 3
            module = ".".join(parts[1:-1] if src else parts[:-1])
            cmd = f"python3 -m {module}"
            out[cmd] = (_rank(path, module in mentioned, False), path)
            continue
        if not name.endswith(".py") or name in NOT_ENTRIES or name.startswith("test") or read >= MAX_READ:
            continue
        read += 1
        try:
            with open(folder / path, encoding="utf-8", errors="replace") as fh:
                guarded = MAIN_GUARD.search(fh.read(1 << 20)) is not None
        except OSError:
            continue
        if guarded:
            package = "/".join(parts[:-1] + ["__init__.py"]) in names  # a library module's demo, not a run
            out[f"python3 {path}"] = (_rank(path, path in mentioned, package), path)
    return [(cmd, path) for cmd, (_, path) in sorted(out.items(), key=lambda kv: kv[1][0])]


def _rank(path: str, mentioned: bool, package: bool) -> tuple:
    """A README's runs first, then the top folder's scripts, then scripts outside packages, training-like names
    first, then the shallow ones."""
    name = path.rsplit("/", 1)[-1]
    word = 0 if "train" in name else 1 if any(w in name for w in ("main", "run", "finetune", "pretrain")) else 2
    return (not mentioned, "/" in path, package, word, path.count("/"), path)


def _readme_runs(folder: Path, files: set[str]) -> set[str]:
    """The scripts (paths) and modules a README's ``python X.py`` / ``python -m M`` lines run, that the project has."""
    seen: set[str] = set()
    for readme in sorted(folder.glob("README*"))[:3]:
        try:
            text = readme.read_text(encoding="utf-8", errors="replace")[:1 << 20]
        except OSError:
            continue
        for module, script in README_RUN.findall(text):
            name = module or script.removeprefix("./")
            if module or name in files:
                seen.add(name)
            else:  # run from its own folder (``cd projects/chargpt; python chargpt.py``): the one file of that name
                alike = [f for f in files if f.endswith("/" + name)]
                seen.update(alike if len(alike) == 1 else [])
    return seen


def packages(files: list[str]) -> list[str]:
    """The project's own top-level packages (``mingpt/__init__.py``): a script below the top folder imports them
    only with the work folder on its path (``PYTHONPATH = "."``)."""
    return sorted({f.split("/")[0] for f in files if f.count("/") == 1 and f.endswith("/__init__.py")})
