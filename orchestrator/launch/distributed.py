"""Pure: what each node of a job over several containers runs (command and environment).

Given what the nodes reported (address, interface, GPUs), every node gets the same launcher line but its
own rank facts; the recipe is the one measured to work whatever a container's /etc/hosts holds::

    python3 -m torch.distributed.run --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d
      --rdzv-endpoint=10.77.0.200:29400 --rdzv-id=tinylm-exp7 --rdzv-conf=is_host=1
      --local-addr=10.77.0.200 train.py

With ``launcher = "none"`` the project's command runs as it is, with the ``ORCH_*`` rank variables.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass, field

from . import command as commands
from ..config import DistributedSection
from ..errors import InputError

PYTHONS = ("python", "python3")


@dataclass(frozen=True)
class NodeFacts:
    """What one node is, as the controller and the node's agent know it."""

    rank: int
    name: str
    address: str | None = None
    interface: str | None = None
    gpus: int = 0


@dataclass
class NodeRun:
    rank: int
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    job: dict = field(default_factory=dict)  # who the node is to its peers' stall watchdogs (agent/run/heartbeat.py)


def launcher(dist: DistributedSection, nnodes: int) -> str:
    return dist.launcher or ("torchrun" if nnodes > 1 else "none")


def nproc(dist: DistributedSection, node: NodeFacts) -> int:
    return (node.gpus or 1) if dist.nproc_per_node == "auto" else int(dist.nproc_per_node)


def _is_python(word: str) -> bool:
    base = posixpath.basename(word)
    return base in PYTHONS or (base.startswith("python3.") and base[len("python3."):].isdigit())


def script_args(argv: list[str]) -> list[str]:
    """The project's command as torchrun takes it: its interpreter word dropped, else ``--no-python``.

    ``python3 -u train.py --lr 1`` -> ``train.py --lr 1``; ``python3 -m pkg.train`` -> ``-m pkg.train``;
    ``./train.sh`` -> ``--no-python ./train.sh``.
    """
    if not argv or not _is_python(argv[0]):
        return ["--no-python", *argv]
    rest = list(argv[1:])
    while rest and rest[0].startswith("-") and rest[0] != "-m":
        rest.pop(0)  # interpreter flags (-u, -O): torchrun starts workers with its own interpreter
    return rest


def python_of(command: list[str] | str) -> str | None:
    """The interpreter word of a command that runs a Python script (``python3 train.py``, ``OMP=1 python -u
    -m pkg``: a shell line of one simple command), which torchrun can be put in front of; else None."""
    if isinstance(command, str):
        if not commands.simple(command):
            return None
        raw = _line_words(command)[1]
        words = [shlex.split(w)[0] if shlex.split(w) else "" for w in raw]
    else:
        words = list(command)
    return words[0] if words and _is_python(words[0]) else None


def rdzv_id(project: str, exp_id: int | None) -> str:
    return f"{project}-exp{exp_id if exp_id is not None else 'N'}"


def _line_words(line: str) -> tuple[list[str], list[str]]:
    """A shell line's leading ``NAME=value`` words and the rest, as written (``$VAR``s expand on the node)."""
    raw = commands.words(line.strip())
    n = next((i for i, w in enumerate(raw) if not commands.ASSIGNMENT.match(w)), len(raw))
    return raw[:n], raw[n:]


def _launched(cmd: list[str], command: list[str] | str) -> list[str]:
    """torchrun's words (``cmd``) before the project's script: an argument list, or for a shell line the line
    ``exec <torchrun words> <the user's words as written>`` under ``sh -c``."""
    if isinstance(command, list):
        return cmd + script_args(command)
    assigns, raw = _line_words(command)
    plain = [shlex.split(w)[0] if shlex.split(w) else "" for w in raw]  # what each word is, to find the script
    rest = raw[len(plain) - len(script_args(plain)):] if plain and _is_python(plain[0]) else ["--no-python", *raw]
    return [commands.SHELL, "-c", " ".join([*assigns, "exec", shlex.join(cmd), *rest])]


def plan(nodes: list[NodeFacts], argv: list[str] | str, dist: DistributedSection, project: str,
         exp_id: int | None, restarts: int = 0) -> list[NodeRun]:
    """One ``NodeRun`` per node, in rank order; node 0 hosts the rendezvous.

    ``argv``: the project's command as written; a string is a shell line (``command.py``). ``restarts``
    (``[run] restarts``): how often torchrun relaunches every node's workers after a failure."""
    n = len(nodes)
    master = nodes[0].address or "<node0-address>"
    addrs = " ".join(x.address or f"<node{x.rank}-address>" for x in nodes)
    how = launcher(dist, n)
    line = argv if isinstance(argv, str) else None
    if line is not None and how != "none" and not commands.simple(line):
        raise InputError(f"[project] command {line!r:.120} is more than one simple command (it has shell "
                         f"operators, redirects or several lines): the {how} launcher cannot be put in front of it",
                         hint='set [distributed] launcher = "none" and start torchrun in the line yourself, '
                              "or run a script from the revision")
    words = [shlex.split(w)[0] for w in _line_words(line)[1]] if line is not None else argv
    runs = []
    for node in nodes:
        job = {"id": rdzv_id(project, exp_id), "rank": node.rank, "addrs": addrs.split(" "), "port": dist.heartbeat}
        env = {"ORCH_NNODES": str(n), "ORCH_NODE_RANK": str(node.rank), "ORCH_NODE_ADDRS": addrs,
               "ORCH_MASTER_ADDR": master, "ORCH_MASTER_PORT": str(dist.port)}
        iface = dist.interface or node.interface
        if how == "none":
            runs.append(NodeRun(node.rank, node.name, commands.exec_argv(argv), env, job))
            continue
        if iface:
            env.update(GLOO_SOCKET_IFNAME=iface, NCCL_SOCKET_IFNAME=iface)
        if restarts > 0:
            env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        python = words[0] if words and _is_python(words[0]) else "python3"
        cmd = [python, "-m", "torch.distributed.run", f"--nnodes={n}", f"--nproc-per-node={nproc(dist, node)}",
               "--rdzv-backend=c10d", f"--rdzv-endpoint={master}:{dist.port}", f"--rdzv-id={rdzv_id(project, exp_id)}",
               f"--rdzv-conf=is_host={1 if node.rank == 0 else 0}",
               f"--local-addr={node.address or f'<node{node.rank}-address>'}"]
        if restarts > 0:
            cmd.append(f"--max-restarts={restarts}")
        runs.append(NodeRun(node.rank, node.name, _launched(cmd, argv), env, job))
    return runs


_WORKER_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: \d+")


def before_launcher_report(lines: list[str], keep: int = 15) -> tuple[list[str], int | None]:
    """A node's last lines with torchrun's own failure report (its traceback and summary, ~40 lines) cut
    off after its first line, so the script's last words show; and the worker's exit code it names.

    ``[..., "boom", "E1201 ... api.py:882] failed (exitcode: 3) local_rank: 0 (pid: 68) of binary: ...",
    "Traceback ...", ...]`` -> ``([..., "boom", "E1201 ... failed (exitcode: 3) ..."], 3)``
    """
    marks = [i for i, line in enumerate(lines) if _WORKER_FAILED.search(line)]
    if not marks:
        return lines[-keep:], None
    first = marks[0]
    code = int(_WORKER_FAILED.search(lines[first]).group(1))  # type: ignore[union-attr]
    return lines[max(0, first + 1 - keep):first + 1], code
