"""The warm orch process (``python -m orchestrator.warm.server SOCKET IDLE``): orch's modules loaded once,
a child forked for each command (``client.py`` sends it).

It runs no command itself and starts no thread, so each child begins from the same clean state, as a fresh
``orch`` would. The child takes the caller's standard streams, folder, environment, umask and resource limits
(a command, and the runs it launches on the local target, see what the caller has: a limit it cannot take, a hard
one above this process's, sends the command back to run in the caller), runs the command, and sends back its
exit code; when the caller goes away first (killed), the child kills itself.
The process exits after IDLE seconds without a command, or when its socket is removed.
"""

from __future__ import annotations

import gc
import io
import marshal
import os
import signal
import socket
import sys
import threading
import traceback
from pathlib import Path

from .. import sockets
from .client import CODE_SIZE, DONE, pack, unpack

PRELOAD = ("orchestrator.cli.main", "orchestrator.cli.run", "orchestrator.cli.status", "orchestrator.cli.logs",
           "orchestrator.cli.common", "orchestrator.watch.status", "orchestrator.watch.log_view",
           "orchestrator.config", "orchestrator.records.experiments", "orchestrator.records.reconcile",
           "orchestrator.reach.agent_client", "orchestrator.reach.keeper.client", "orchestrator.reach.keeper.server",
           "orchestrator.watch.metrics_view", "orchestrator.agent.run.series", "orchestrator.records.listing",
           "orchestrator.reach.targets", "orchestrator.launch.operations", "orchestrator.launch.push",
           "orchestrator.watch.follow", "orchestrator.cli.job", "orchestrator.launch.prepare",
           "orchestrator.launch.spare_jobs", "orchestrator.reach.current", "orchestrator.secrets",
           "orchestrator.watch.metrics", "orchestrator.agent.run.handover", "orchestrator.agent.serving.validate",
           "orchestrator.agent.layout", "orchestrator.agent.strict", "orchestrator.agent.run.launch_env", "resource",
           "orchestrator.launch.queueing", "orchestrator.launch.slurm", "yaml",
           "orchestrator.launch.sweep_target",  # status looks for searches conducted on their targets
           "pydantic.type_adapter", "rich.console", "rich.table", "sqlite3", "tomllib",
           # what every status reads with, and status --all's threads
           "orchestrator.watch.gpu_use", "orchestrator.watch.logparse", "orchestrator.records.side_by_side",
           "concurrent.futures.thread",
           # a job's commands (deploy, status, stop over several nodes), and a CT named by its id (not the Proxmox
           # client's libraries: those load only when the API is really asked)
           "orchestrator.launch.multinode", "orchestrator.launch.distributed", "orchestrator.records.job_settle",
           "orchestrator.watch.job_progress", "orchestrator.reach.ct_cache", "orchestrator.reach.proxmox",
           # a CT's remembered address, checked before it is used (its name through IDNA, as the socket module
           # encodes any host name), and the machine a CT's agent must be
           "encodings.idna", "orchestrator.reach.identity")

# their command lines read ("group sub": a group's sub-command)
PREPARED = ("deploy", "restart", "stop", "status", "logs", "checkpoints", "experiments", "experiments list")


# an orch.toml with a target of each kind, read once at the start (``_rehearse``): what pydantic builds at a model's
# first validation (~6-9 ms of a command's settings) is then built once here, not again in every command's child
REHEARSAL = """\
default_target = "ssh"
[project]
name = "warm"
sources = ["train.py"]
command = "python3 train.py"
env = { OMP_NUM_THREADS = "1" }
[paths]
root = "/workspace/orch"
checkpoints = "/workspace/checkpoints/{project}"
[run]
stop_timeout = 30
[batching]
token_budget = 2048
max_seq_len = 128
[ssh]
command_timeout = 60
[targets.ssh]
kind = "ssh"
host = "127.0.0.1"
user = "root"
[targets.ct]
kind = "proxmox"
ct = 200
[targets.lab]
kind = "slurm"
host = "127.0.0.1"
"""


def _rehearse() -> None:
    """Read ``REHEARSAL`` as a command reads its orch.toml (in a folder of this process's own, then removed)."""
    import tempfile

    from orchestrator.config import load_settings

    with tempfile.TemporaryDirectory(prefix="orch-warm-") as folder:
        path = Path(folder) / "orch.toml"
        path.write_text(REHEARSAL)
        load_settings(path, env={}, notice=lambda _line: None)


def _preload() -> None:
    import importlib

    from ..cli import pydantic_plugins

    pydantic_plugins.install()  # as a command in a process of its own loads pydantic
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            continue
    from orchestrator.cli.main import root_command
    from orchestrator.launch import playbooks
    from orchestrator.reach.agent_client import agent_zip

    agent_zip()  # built once here: every command's agent calls name it by its hash
    # the SSH transport and paramiko (through its one loader: invoke held back), for the command that connects with
    # no keeper up (the first after a pause): ~40 ms of imports it would otherwise pay before its handshake
    from orchestrator.reach.transport import ssh, sshlib  # noqa: F401

    sshlib.paramiko()
    for name in playbooks.builtin_names():  # parsed and checked once here: a deploy reads only the file
        playbooks.load_file(playbooks.builtin_dir() / f"{name}.yaml")
    root_command(prepare=PREPARED)
    try:
        _rehearse()
    except Exception:  # noqa: BLE001 (a warm-up only: the commands read their own orch.toml as ever)
        pass


def _streams() -> None:
    """Python's standard streams over the caller's descriptors, buffered as Python would for them."""
    tty = os.isatty(1)
    sys.stdin = io.TextIOWrapper(io.open(0, "rb", closefd=False), encoding="utf-8", errors="strict")
    sys.stdout = io.TextIOWrapper(io.open(1, "wb", closefd=False), encoding="utf-8", errors="strict",
                                  line_buffering=tty)
    sys.stderr = io.TextIOWrapper(io.open(2, "wb", closefd=False), encoding="utf-8", errors="backslashreplace",
                                  line_buffering=True)


ANSWERED = threading.Event()  # the child's exit code went back: the caller may go, upkeep goes on


def _watch_caller(conn: socket.socket) -> None:
    """The caller never closes before its answer: if it does, it was killed, and so is this command."""
    try:
        while conn.recv(64):
            pass
    except OSError:
        pass
    if not ANSWERED.is_set():
        os.kill(os.getpid(), signal.SIGKILL)


def _take_limits(limits: dict) -> None:
    """The caller's resource limits; raises where one is out of this process's reach (a higher hard limit)."""
    import resource

    for which, wanted in limits.items():
        if resource.getrlimit(which) != tuple(wanted):
            resource.setrlimit(which, tuple(wanted))


def _child(conn: socket.socket, fds: list[int], request: dict) -> None:
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the command waits for its own subprocesses
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for target, fd in zip((0, 1, 2), fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.umask(int(request["umask"]))
        os.environ.clear()
        os.environ.update(request["env"])
        _take_limits(request.get("limits") or {})  # before the pid goes back: one it cannot take, none is sent
        _streams()
        sys.argv = ["orch", *request["argv"]]
        from orchestrator import after_answer
        from orchestrator.cli.main import main

        def interrupted_while_starting(_signum: int, _frame: object) -> None:
            """A Ctrl-C the caller passes on before the command runs: nothing was done, as orch here would say;
            its exit code goes back to the caller, which would otherwise die of the signal it passed on."""
            os.write(2, b"interrupted: nothing was done\n")
            try:
                conn.sendall(pack(130))
            except OSError:
                pass
            os._exit(130)

        signal.signal(signal.SIGINT, interrupted_while_starting)
        conn.sendall(pack(os.getpid()))
        threading.Thread(target=_watch_caller, args=(conn,), daemon=True).start()
        after_answer.hold()  # the registry's checkpoint waits for the answer

        try:
            main(request["argv"])
            code = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                sys.stderr.write(f"{exc.code}\n")
        except BaseException:  # what Python prints for an uncaught exception, and its exit code, as orch here
            code = 1
            try:
                traceback.print_exc()
            except OSError:
                pass
        # the command is over: a Ctrl-C from now on changes nothing, and the code it ended with is what goes back
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except OSError:
                pass
        # the caller's terminal or pipes let go before the code is sent: whoever reads them sees their end as the
        # caller exits, not once this big process has finished exiting
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
        ANSWERED.set()
        # the code goes first: it reaches the caller even if this process is killed from here on (as the keeper it
        # is about to become, say); the caller then waits for DONE, or this process's end, before it exits, so the
        # keeper's socket listens before the next command can be typed
        _tell_caller(conn, pack(code))
        after_answer.answering()
        _tell_caller(conn, DONE)
        after_answer.finish()
    finally:
        os._exit(code)


def _tell_caller(conn: socket.socket, data: bytes) -> None:
    """Send ``data`` to the caller; one killed after its answer began hears nothing, and the upkeep still runs."""
    try:
        conn.sendall(data)
    except OSError:
        pass


def serve(path: Path, idle: float) -> int:
    server = sockets.Server(path)
    if not server.claim():
        return 0  # another one took this socket a moment ago
    try:
        gc.disable()  # no collection leaves holes among the loaded modules' objects meanwhile
        _preload()
        # what is loaded now is never collected: a child's collections pass it by, so they neither take the
        # time to walk it nor write to (and so copy) the pages it shares with this process
        gc.freeze()
        gc.enable()
        server.bind()
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped as they end
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # orch connections close: tidy up and go
        for conn in server.connections(idle):
            conn.settimeout(5)
            try:
                head, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 3)
                if len(head) < CODE_SIZE:
                    raise ValueError("no request")
                size = unpack(head[:CODE_SIZE])
                body = head[CODE_SIZE:]
                while len(body) < size:
                    more = conn.recv(size - len(body))
                    if not more:
                        raise OSError("the caller went away")
                    body += more
                request = marshal.loads(body)  # the client's: this same Python, this user's socket
                if not isinstance(request, dict):
                    raise ValueError("not a request")
            except (OSError, ValueError, EOFError, TypeError):
                conn.close()
                continue
            if len(fds) != 3:
                for fd in fds:
                    os.close(fd)
                conn.close()
                continue
            conn.settimeout(None)
            if os.fork() == 0:
                server.close_in_child()
                _child(conn, fds, request)
            for fd in fds:
                os.close(fd)
            conn.close()
    finally:
        server.close()
    return 0


def main(argv: list[str]) -> int:
    return serve(Path(argv[0]), float(argv[1]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
