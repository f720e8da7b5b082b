"""Secrets from the agent to a run's supervisor through a FIFO: never on disk, in argv, or in tmux.

The agent creates ``secrets.pipe`` (0600) in the run folder, opens it read-write (which does not
block) and writes the values into the pipe's buffer *before* tmux starts the supervisor. The
supervisor opens the FIFO, unlinks it (its signal to the agent) and reads the values from the pipe;
the agent then closes its end. The bytes only ever live in kernel pipe buffers and, in the end, in the
run's environment. If the agent dies first, the buffer is gone and the supervisor reads an empty pipe:
the run does not start without its secrets.

A Slurm job has no pipe from the agent (its supervisors start on compute nodes, whenever Slurm runs it): there the
values wait in one file per node, ``secrets/<rank>.json`` in the run folder on the shared file system (folder 0700,
file 0600, never in ``job.sh``, ``slurm.json`` or a record), which that node's supervisor reads (``leave``,
``take``): each attempt of a requeued job reads them again. A stop removes them, and so does the first status that
finds the run ended for good (``drop``).
"""

from __future__ import annotations

import json
import os
import select
import time

from ..layout import write_atomic
from ..protocol import AgentFailure

PIPE = "secrets.pipe"
LIMIT = 60000  # below Linux's 64 KiB pipe buffer: one write never blocks


def check(secrets: object) -> dict:
    if not isinstance(secrets, dict) or not all(isinstance(k, str) and k and isinstance(v, str)
                                                and "=" not in k and "\0" not in k + v
                                                for k, v in secrets.items()):
        raise AgentFailure("input", "secrets must map environment variable names to strings")
    return secrets


class Sender:
    """The agent's end: holds the values in the pipe until the supervisor has taken them."""

    def __init__(self, run_dir: str, secrets: dict) -> None:
        data = json.dumps(secrets).encode() + b"\n"
        if len(data) > LIMIT:
            raise AgentFailure("input", f"the secrets are {len(data)} bytes together; at most {LIMIT} fit",
                               "keep large credentials in a file on the target and name its path in a secret")
        self.path = os.path.join(run_dir, PIPE)
        os.mkfifo(self.path, 0o600)
        self.fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK)  # O_RDWR: the FIFO opens without a reader
        os.write(self.fd, data)

    def wait_taken(self, run_dir: str, timeout: float = 30.0) -> bool:
        """True once the supervisor opened the pipe (it unlinks it), False if it ended or never came."""
        deadline = time.monotonic() + timeout
        while os.path.lexists(self.path):
            if os.path.exists(os.path.join(run_dir, "exit.json")) or time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True

    def close(self) -> None:
        os.close(self.fd)
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


FOLDER = "secrets"  # a Slurm job's: one file per node


def leave(run_dir: str, secrets: dict, nodes: int) -> None:
    """A Slurm job's values, one 0600 file per node for its supervisor to take."""
    data = json.dumps(secrets).encode() + b"\n"
    folder = os.path.join(run_dir, FOLDER)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)  # whatever the umask made of it
    for rank in range(max(1, nodes)):
        write_atomic(os.path.join(folder, f"{rank}.json"), data, 0o600)


def take(run_dir: str, environ: dict) -> dict | None:
    """This node's values (``SLURM_NODEID``); None when there are none. The file stays while the job may run
    again (preempted, requeued, resubmitted at its time limit: the next attempt takes them again); ``drop``
    removes it once the run has ended for good or is stopped."""
    rank = environ.get("SLURM_NODEID", "0")
    path = os.path.join(run_dir, FOLDER, f"{rank if rank.isdigit() else 0}.json")
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    try:
        values = json.loads(data)
    except ValueError:
        return None
    return values if isinstance(values, dict) else None


def drop(run_dir: str) -> None:
    """Every node's values: a job stopped, cancelled, or ended for good."""
    folder = os.path.join(run_dir, FOLDER)
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        _remove(os.path.join(folder, name))


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def receive(run_dir: str, timeout: float = 30.0) -> dict | None:
    """The supervisor's end: the values, or None when they cannot arrive (the agent is gone)."""
    path = os.path.join(run_dir, PIPE)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        os.unlink(path)
        data = b""
        deadline = time.monotonic() + timeout
        while not data.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                return None  # every writer closed before the whole message came
            data += chunk
    finally:
        os.close(fd)
    try:
        values = json.loads(data)
    except ValueError:
        return None
    return values if isinstance(values, dict) else None
