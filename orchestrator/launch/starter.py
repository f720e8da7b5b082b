"""``orch init``'s files: a commented starter orch.toml, and editable copies of the built-in playbooks."""

from __future__ import annotations

from pathlib import Path

TEMPLATE = '''# orch.toml: how orch deploys this project. Precedence: defaults < this file < ORCH_SECTION__KEY
# environment variables < --set section.key=value flags.
default_target = "local"               # where a fresh clone acts; after `deploy --ct N`, bare commands act on CT N

[project]
name = "{name}"
sources = ["train.py"]                 # files/folders (relative to this file) that make up a revision: a named
                                       # path is always sent; .gitignore/.orchignore (with !) apply inside folders
# follow_symlinks = ["data/big"]       # symlinks sent although they lead outside the project (others: refused)
command = "python3 train.py"           # a shell line ($VARS, &&) run in the run's work folder; a list: no shell
env = {{ OMP_NUM_THREADS = "4" }}
# secrets = ["WANDB_API_KEY"]          # values from the environment or .orch/secrets.env (chmod 600); never recorded
# total_steps = 10000                  # for the ETA, if the log does not print total_steps=

[paths]                                # on the target
root = "/workspace/orch"               # orch's own area: agent, revisions, runs
checkpoints = "/workspace/checkpoints/{{project}}"  # one folder per project ({{project}} = [project] name);
                                       # its trash: beside it, or .orch-trash/ inside it when it is a mount point

[batching]                             # recorded with every launch, handed to the run as ORCH_BATCHING_FILE
strategy = "megabatch"                 # sorted | shuffle | bucketed | megabatch
token_budget = 49152
max_seq_len = 8192
seed = 0
target_efficiency = 0.99               # megabatch size chosen from the data to keep 99% of sorted's efficiency
window = 8                             # stratified order: every 8 steps mix short and long batches
# lengths = "data/lengths.npy"         # lets orch plan and record the padding cost of each launch
# buckets = [0, 770, 1216, 1728, 2432, 3296, 8192]   (bucketed)

[run]
stop_timeout = 30                      # seconds after SIGINT before SIGTERM
term_timeout = 10                      # seconds after SIGTERM before SIGKILL
# restarts = 3                         # relaunch a run that failed (a job: torchrun, on every node)
# stall_after = 1800                   # seconds without a new log line: stalled, stopped (then restarted)

[trash]
# keep = 5                             # keep at most 5 trash entries (older ones are purged)

# [targets.local] is built in: this machine, under $XDG_DATA_HOME/orch/local (else ~/.local/share/orch/local)

# [proxmox]
# host = "pve1.lan"
# token_id = "root@pam!orch"           # secret from ORCH_PROXMOX_TOKEN or token_file (mode 0600)
# verify_ssl = "/etc/orch/pve-root-ca.pem"
#
# [targets.ct200]
# kind = "proxmox"
# ct = 200
# access = "ssh"                       # or "pct": through the node, no sshd needed in the CT
'''


def project_name(folder: Path) -> str:
    """The starter's ``[project] name``: the folder's name, with what a name may not hold replaced by ``-``."""
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in folder.name) or "project"


def write(folder: Path, *, name: str, force: bool, playbooks: bool) -> list[Path]:
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
    path.write_text(TEMPLATE.format(name=name or project_name(folder)), encoding="utf-8")
    return written + [path]
