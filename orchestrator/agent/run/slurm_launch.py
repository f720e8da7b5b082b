"""A Slurm job over several nodes started with torchrun, as a job over containers is.

The controller plans each rank's launcher line as it does for containers (``launch/distributed.plan``: c10d
rendezvous on the first node, ``--local-addr`` each node's own); the nodes' addresses are not known until Slurm
runs the job, so the lines hold a place for each (``{orch:node1}``), kept in ``torchrun.json`` in the run folder::

    {"argv": [[rank 0's words], [rank 1's words]], "places": ["{orch:node0}", "{orch:node1}"],
     "env": {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}, "python": "python3", "port": 29400}

Each node's supervisor takes its rank's line (``SLURM_NODEID``), fills in the allocation's addresses (its node
list, in Slurm's order, resolved here) and runs it, where the script's Python can import torch; where it cannot,
the command runs as it is, with the ``ORCH_*`` variables, and the log says why. Restarts are then torchrun's (one
node's supervisor relaunching alone would wait for a rendezvous that has gone), as on containers. A stop's
signal reaches torchrun and its workers from Slurm alone, which signals every process of the job's step: the
supervisor does not pass it on a second time.
"""

from __future__ import annotations

import os
import re
import subprocess

from ..layout import read_json
from .slurm import LAUNCHER, expand

FINDS_TORCH = "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"
ADDRESS = re.compile(r"^[A-Za-z0-9.:_-]+$")  # what may stand in a launcher word: a name or an address


def address(name: str) -> str:
    """A node's address as its peers reach it (Slurm's name resolved here), else its name."""
    import socket  # here, not at the top: every status imports this module, only a job's launch resolves

    try:
        found = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return name
    return str(found[0][4][0]) if found else name


def has_torch(python: str, env: dict, cwd: str) -> bool:
    """Whether the script's Python, with the run's environment, finds torch (without importing it: seconds)."""
    try:
        return subprocess.run([python, "-c", FINDS_TORCH], env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def fill(words: list[str], places: list[str], addrs: list[str]) -> list[str]:
    out = []
    for word in words:
        for place, addr in zip(places, addrs):
            word = word.replace(place, addr)
        out.append(word)
    return out


def launch(run_dir: str, launch_rec: dict, env: dict, environ: dict) -> tuple[dict, str | None]:
    """This node's launch: with its rank's torchrun line where one was planned and torch is there (its restarts
    torchrun's), else as it was; and what to say of it in the log (None: nothing planned)."""
    plan = read_json(os.path.join(run_dir, LAUNCHER))
    if not isinstance(plan, dict) or not plan.get("argv"):
        return launch_rec, None
    rank = environ.get("SLURM_NODEID", "")
    names = expand(environ.get("SLURM_JOB_NODELIST", ""))
    if not rank.isdigit() or int(rank) >= len(plan["argv"]) or len(names) != len(plan["argv"]):
        return launch_rec, (f"orch: the allocation's nodes ({', '.join(names) or '?'}, this one {rank or '?'}) are "
                            f"not the {len(plan['argv'])} torchrun was planned for: the command runs as it is\n")
    if not has_torch(plan["python"], env, launch_rec.get("cwd") or run_dir):
        return launch_rec, (f"orch: {plan['python']} cannot import torch on this node: the command runs as it is, "
                            "with ORCH_NODE_RANK, ORCH_NNODES and ORCH_MASTER_ADDR (start torchrun in it yourself)\n")
    addrs = [address(name) for name in names]
    if not all(ADDRESS.match(a) for a in addrs):
        return launch_rec, f"orch: a node's address is not one torchrun can take ({addrs}): the command runs as it is\n"
    env.update(plan.get("env") or {})
    argv = fill(plan["argv"][int(rank)], plan["places"], addrs)
    recovery = dict(launch_rec.get("recovery") or {}, restarts=0, resume_after_reboot=False)
    said = (f"orch: torchrun over {len(names)} nodes, rendezvous (c10d) at {addrs[0]}:{plan['port']}, this node "
            f"rank {rank}\n")
    # Slurm signals every process of the step itself (scancel --signal, the time limit's): torchrun must get a
    # stop once, or a second SIGINT during its shutdown has it SIGTERM its workers before their final checkpoint
    return dict(launch_rec, argv=argv, recovery=recovery, step_signalled=True), said
