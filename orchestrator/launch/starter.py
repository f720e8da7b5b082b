"""``orch init``'s files: a starter orch.toml read from the project folder, the ``.gitignore`` lines that keep
orch's own folders out of git, and editable copies of the built-in playbooks.

``survey(folder)`` reads what a starter needs (the entry point, the requirements, the folders ``.gitignore``
leaves out) without writing anything; ``starter(survey, ...)`` is the orch.toml's text.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ORCH_FOLDERS = (".orch/", "orch-pull/")  # the registry (and secrets.env), and what `orch pull` copies here
_NOT_DATA = {"build", "dist", "venv", "env", "node_modules", "site", "htmlcov"}


@dataclass
class Survey:
    """What ``orch init`` found in a project folder."""

    command: str | list[str] | None = None  # how the entry point runs; None: none was found
    entry: str = ""  # what was found, in words: "main.py", "[project.scripts] tinylm = tinylm.cli:main"
    candidates: list[str] = field(default_factory=list)  # commands proposed, best first, when none was chosen
    packages: list[str] = field(default_factory=list)  # the project's top-level packages a candidate may import
    env: dict[str, str] = field(default_factory=dict)
    requirements: tuple[str, str] | None = None  # ([env] key, its TOML value), e.g. ("requirements", '"req.txt"')
    left_out: list[tuple[str, str]] = field(default_factory=list)  # (folder/, the .gitignore rule that drops it)
    git: bool = False  # a git work tree (or a folder with a .gitignore)
    unignored: list[str] = field(default_factory=list)  # ORCH_FOLDERS that .gitignore does not ignore yet


def _toml(value: object) -> str:
    """A TOML value for a string or a list of strings (JSON's escapes are TOML's)."""
    return json.dumps(value)


def _pyproject(folder: Path) -> dict:
    try:
        return tomllib.loads((folder / "pyproject.toml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return {}


def _requirements(folder: Path, pyproject: dict) -> tuple[str, str] | None:
    if (folder / "uv.lock").is_file():
        return "lock", _toml("uv.lock")
    if (folder / "requirements.txt").is_file():
        return "requirements", _toml("requirements.txt")
    if (pyproject.get("project") or {}).get("dependencies"):
        return "pyproject", "true"
    return None


def _git_ignored(folder: Path) -> tuple[bool, list[str]]:
    """(a git project, the ORCH_FOLDERS its top .gitignore does not ignore yet)."""
    import pathspec

    here = folder.resolve()
    git = (folder / ".gitignore").is_file() or any((p / ".git").exists() for p in (here, *here.parents))
    try:
        lines = (folder / ".gitignore").read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        lines = []
    spec = pathspec.PathSpec.from_lines("gitwildmatch", lines)
    return git, [name for name in ORCH_FOLDERS if not spec.match_file(name)]


def _selection(folder: Path):
    """What a ``sources = ["."]`` revision would hold (None where it cannot be listed: a symlink out, no file)."""
    from ..errors import OrchError
    from .sources import collect

    try:
        return collect(folder, ["."])
    except (OrchError, OSError):
        return None


def _left_out(selection) -> list[tuple[str, str]]:
    """The folders a ``sources = ["."]`` revision leaves out by the project's .gitignore (data, runs, ...)."""
    if selection is None:
        return []
    out = []
    for item in selection.left_out:
        name = item.path.rstrip("/").rsplit("/", 1)[-1]
        if (item.path.endswith("/") and item.origin.endswith(".gitignore") and item.path not in ORCH_FOLDERS
                and not name.startswith(".") and name not in _NOT_DATA and not name.endswith(".egg-info")):
            out.append((item.path, item.rule))
    return out


def survey(folder: Path) -> Survey:
    """Read ``folder`` for a starter orch.toml; nothing is written."""
    from .entry_points import find

    pyproject = _pyproject(folder)
    selection = _selection(folder)
    entry = find(folder, pyproject, list(selection.files) if selection is not None else [])
    found = Survey(command=entry.command, entry=entry.entry, candidates=entry.candidates, env=entry.env,
                   packages=entry.packages)
    found.requirements = _requirements(folder, pyproject)
    found.git, found.unignored = _git_ignored(folder)
    found.left_out = _left_out(selection)
    return found


def project_name(folder: Path) -> str:
    """The starter's ``[project] name``: the folder's name, with what a name may not hold replaced by ``-``."""
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in folder.name) or "project"


HEAD = '''# orch.toml: how orch deploys this project. Precedence: defaults < this file < ORCH_SECTION__KEY
# environment variables < --set section.key=value flags.
default_target = "local"               # where a fresh clone acts; after `deploy --ct N`, bare commands act on CT N

[project]
name = "{name}"
sources = ["."]                        # files/folders (relative to this file) that make up a revision: a named
                                       # path is always sent; .gitignore/.orchignore (with !) apply inside folders
{left_out}# follow_symlinks = ["data/big"]       # symlinks sent although they lead outside the project (others: refused)
{command}{env}# secrets = ["WANDB_API_KEY"]          # values from the environment or .orch/secrets.env (chmod 600); never recorded
# total_steps = 10000                  # for the ETA, if the log does not print total_steps=
{requirements}
[paths]                                # on a Proxmox or SSH target (the local target has its own, below)
root = "/workspace/orch"               # orch's own area: agent, revisions, runs
checkpoints = "/workspace/checkpoints/{{project}}"  # one folder per project ({{project}} = [project] name);
                                       # its trash: beside it, or .orch-trash/ inside it when it is a mount point
{batching}
[run]
stop_timeout = 30                      # seconds after SIGINT before SIGTERM
term_timeout = 10                      # seconds after SIGTERM before SIGKILL
# restarts = 3                         # relaunch a run that failed (a job: torchrun, on every node)
# stall_after = 1800                   # seconds without a new log line: stalled, stopped (then restarted)

[trash]
# keep = 5                             # keep at most 5 trash entries (older ones are purged)

# [targets.local] is built in: this machine, under $XDG_DATA_HOME/orch/local (else ~/.local/share/orch/local);
# it ignores [paths] above

# [proxmox]
# host = "pve1.lan"                    # or "pve1.lan:8006"
# token_id = "root@pam!orch"           # secret from ORCH_PROXMOX_TOKEN or token_file (mode 0600)
# verify_ssl = "/etc/orch/pve-root-ca.pem"
#
# [targets.ct200]
# kind = "proxmox"
# ct = 200
# access = "ssh"                       # or "pct": through the node, no sshd needed in the CT
'''

BATCHING = '''
[batching]                             # recorded with every launch, handed to the run as ORCH_BATCHING_FILE
strategy = "megabatch"                 # sorted | shuffle | bucketed | megabatch
token_budget = 49152
max_seq_len = 8192
seed = 0
target_efficiency = 0.99               # megabatch size chosen from the data to keep 99% of sorted's efficiency
window = 8                             # stratified order: every 8 steps mix short and long batches
# lengths = "data/lengths.npy"         # lets orch plan and record the padding cost of each launch
# buckets = [0, 770, 1216, 1728, 2432, 3296, 8192]   (bucketed)
'''


def starter(found: Survey, *, name: str, batching: bool) -> str:
    """The orch.toml text for what ``survey`` found."""
    if found.command is None:
        command = ("# command: not set. No train.py or main.py at the top of the project, no [project.scripts];\n"
                   "# a deploy refuses until it is set. ")
        if found.candidates:
            command += ("What could start the training (uncomment one, or write yours):\n"
                        + "".join(f"# command = {_toml(c)}\n" for c in found.candidates))
            if found.packages:
                command += (f"# (a script below the top folder imports {', '.join(found.packages)} from the run's "
                            'work folder with env = { PYTHONPATH = "." })\n')
        else:
            command += 'No script with an if __name__ == "__main__" was found: name yours, e.g.\n' \
                       '# command = "python3 train.py --out $ORCH_CHECKPOINT_DIR"\n'
    else:
        command = f"command = {_toml(found.command)}\n# (found: {found.entry}); a shell line ($VARS, &&) run in " \
                  "the run's work folder; a list: no shell\n"
    # only what the project needs: a thread cap is the user's call (torchrun sets its own), so it stays a comment
    if found.env:
        env_line = "env = { " + ", ".join(f"{k} = {_toml(v)}" for k, v in found.env.items()) + " }" \
            "  # and e.g. OMP_NUM_THREADS = \"4\" to cap numpy's/torch's CPU threads\n"
    else:
        env_line = '# env = { OMP_NUM_THREADS = "4" }     # variables the run gets (e.g. a cap on numpy\'s/torch\'s ' \
                   "CPU threads)\n"
    left_out = "".join(f"# not sent: {path} ({rule}); the line !{path} in .orchignore sends it\n"
                       for path, rule in found.left_out)
    requirements = ""
    if found.requirements:
        key, value = found.requirements
        requirements = ("\n# [env]                                # the run's own Python environment, built on the "
                        f"target from this\n# {key} = {value}\n")
    return HEAD.format(name=name, left_out=left_out, command=command, env=env_line, requirements=requirements,
                       batching=BATCHING if batching else "")


def add_to_gitignore(folder: Path, names: list[str]) -> Path:
    """Append ``names`` to ``folder``'s .gitignore (made if missing), each on its own line."""
    path = folder / ".gitignore"
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    lead = "" if not text or text.endswith("\n") else "\n"
    path.write_text(text + lead + "# orch: the experiment registry, and what `orch pull` copies here\n"
                    + "".join(f"{n}\n" for n in names), encoding="utf-8")
    return path


def write(folder: Path, *, name: str, force: bool, playbooks: bool, batching: bool = False,
          found: Survey | None = None) -> list[Path]:
    """The files written in ``folder``: with ``playbooks``, the built-in playbooks' copies under ``playbooks/``
    (and orch.toml only when there is none); else orch.toml, refused when one is there unless ``force``."""
    from ..errors import InputError

    path = folder / "orch.toml"
    written: list[Path] = []
    if playbooks:
        from .playbooks import copy_builtin

        written += copy_builtin(folder / "playbooks", force=force)
        if path.exists():
            return written
    if path.exists() and not force:
        raise InputError(f"{path} already exists", hint="pass --force to overwrite it")
    found = found or survey(folder)
    path.write_text(starter(found, name=name or project_name(folder), batching=batching), encoding="utf-8")
    return written + [path]
