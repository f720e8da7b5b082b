"""Fixtures shared by every test: a real project folder for the tinylm example on the local target.

Each test gets its own orch root (so its own private tmux server, named after the root) and its own
registry; the tmux server is killed afterwards, so no run outlives its test.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from tests.waits import wait_for  # noqa: F401  (tests import it from here too)

REPO = Path(__file__).resolve().parent.parent

# A suite started in the background (``cmd &`` in a script) inherits SIGINT ignored, and so would every CLI it
# starts: the tests that press Ctrl-C would see nothing happen. A handler here is reset to the default in children.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
EXAMPLE = REPO / "examples" / "tinylm"


def _interpreters_before_shims() -> None:
    """Where ``python3`` on PATH is pyenv's shim (a bash script running ``pyenv exec``), the interpreter it
    resolves to has its folder put first on PATH, as ``pyenv exec`` does for the program it starts: the same
    ``python3``, reached without two shells and pyenv's lookup (~65 ms of CPU and ~170 ms for every training script
    and helper the tests start with ``python3``)."""
    found = shutil.which("python3")
    if not found or os.sep + "shims" + os.sep not in found:
        return
    try:
        real = subprocess.run(["pyenv", "which", "python3"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return
    real = real.strip()
    if real and os.path.isfile(real) and os.access(real, os.X_OK):
        os.environ["PATH"] = os.path.dirname(real) + os.pathsep + os.environ.get("PATH", "")


_interpreters_before_shims()


WEIGHT = {"cli": 8, "packaging": 8, "agent": 2}  # a test's rough cost by its folder (CLI tests run orch as a process)
HEAVY = {"test_mlflow_export.py": 3, "test_guard.py": 3, "test_env.py": 3, "test_queue.py": 3,
         "test_gpus.py": 2, "test_registry_faults.py": 2,
         "test_wheel.py": 5, "test_ui.py": 3}  # files whose tests take several times a CLI test's (the wheel's: a build and a venv)


@pytest.hookimpl(trylast=True)  # after ``-m`` has deselected its part
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``ORCH_LOCAL_SHARD=a`` or ``b``: half of the selected test files (``tests/groups.py`` runs both halves at
    once). Files are dealt out heaviest first (their tests, weighted by folder) to the lighter half so far; with
    ``ORCH_CLAIMS`` both halves take the next file, heaviest first, as they get free (``tests/claims.py``)."""
    from tests import claims

    shard = os.environ.get("ORCH_LOCAL_SHARD")
    if shard not in ("a", "b"):
        return
    sizes: dict[Path, int] = {}
    for item in items:
        cost = WEIGHT.get(item.path.parent.name, 1) * HEAVY.get(item.path.name, 1)
        sizes[item.path] = sizes.get(item.path, 0) + cost
    if claims.folder() is not None:
        claims.share(config, "local", items, sorted(sizes, key=lambda p: (-sizes[p], str(p))))
        return
    halves: dict[str, set[Path]] = {"a": set(), "b": set()}
    load = {"a": 0, "b": 0}
    for path in sorted(sizes, key=lambda p: (-sizes[p], str(p))):
        lighter = min(load, key=lambda k: (load[k], k))
        halves[lighter].add(path)
        load[lighter] += sizes[path]
    keep = [item for item in items if item.path in halves[shard]]
    drop = [item for item in items if item.path not in halves[shard]]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool | None:
    from tests import claims

    return claims.runtestloop(session)


@pytest.fixture(autouse=True)
def _own_keepers(monkeypatch) -> Iterator[str]:
    """A runtime folder of the test's own: the connection keepers its commands start serve only it, and are
    closed when it ends (a keeper still starting then is killed)."""
    import tempfile

    folder = tempfile.mkdtemp(prefix="orch-rt-", dir="/tmp")
    monkeypatch.setenv("XDG_RUNTIME_DIR", folder)
    yield folder
    from orchestrator.reach.keeper import client
    from orchestrator.warm import client as warm_client

    warm_client.close(everyone=True)  # the folder is the test's own: every home's in it
    client.close(None, everyone=True)
    for marker in Path(folder, "orch").glob("*.spawned"):
        try:
            pid = int(marker.read_text())
            if b"orchestrator.reach.keeper" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError):
            pass
    shutil.rmtree(folder, ignore_errors=True)

CONFIG = """\
default_target = "local"

[project]
name = "tinylm"
sources = ["train.py"]
command = "python3 train.py"
env = {{ OMP_NUM_THREADS = "1", TINYLM_STEPS = "{steps}", TINYLM_CKPT_EVERY = "{ckpt_every}", TINYLM_SLEEP = "{sleep}", TINYLM_SAMPLES = "600" }}

[paths]
root = "{root}"
checkpoints = "{root}/checkpoints"

[batching]
strategy = "megabatch"
token_budget = 4096
max_seq_len = 512
seed = 0

[run]
stop_timeout = 5
term_timeout = 3
lock_timeout = {lock_timeout}

[targets.local]
kind = "local"
root = "{root}"
checkpoints = "{root}/checkpoints"
"""


# a run that takes 3 s to stop after SIGINT: long enough to interrupt a deploy while it stops the run
STUBBORN = ("import signal, time\n"
            "def slow_exit(*_):\n    time.sleep(3)\n    raise SystemExit(0)\n"
            "signal.signal(signal.SIGINT, slow_exit)\n"
            "while True:\n    print('step=1 loss=1.0', flush=True)\n    time.sleep(0.2)\n")


def tmux_socket(root: str) -> str:
    return "orch-" + hashlib.sha256(os.path.normpath(root).encode()).hexdigest()[:8]


class Project:
    """A project folder with orch.toml and train.py, and helpers to run the real CLI on it."""

    def __init__(self, path: Path, root: Path) -> None:
        self.path, self.root = path, root

    def configure(self, steps: int = 40, ckpt_every: int = 10, sleep: float = 0.0, lock_timeout: float = 10,
                  extra: str = "") -> None:
        text = CONFIG.format(steps=steps, ckpt_every=ckpt_every, sleep=sleep, root=self.root,
                             lock_timeout=lock_timeout)
        (self.path / "orch.toml").write_text(text + extra)

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def cli(self, *args: str, input: str | None = None):
        """The CLI in-process through typer's CliRunner, from the project folder."""
        from typer.testing import CliRunner

        from orchestrator.cli.main import app

        old = os.getcwd()
        os.chdir(self.path)
        try:
            return CliRunner().invoke(app, list(args), input=input, prog_name="orch")
        finally:
            os.chdir(old)

    def run(self, *args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
        """The CLI as a real subprocess (``python -m orchestrator.cli.main``)."""
        full_env = dict(os.environ, **(env or {}))
        return subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], cwd=self.path,
                              capture_output=True, text=True, timeout=timeout, env=full_env)

    def registry(self):
        from orchestrator.records.experiments import Registry

        return Registry(self.path / ".orch" / "experiments.db")

    def run_key(self, exp_id: int) -> str:
        """The name of experiment ``exp_id``'s run folder on the target: ``<registry id>-<id>``."""
        return run_dir_of(self.path, Path("/"), exp_id).name

    def run_dir(self, exp_id: int) -> Path:
        """Experiment ``exp_id``'s run folder on the target: ``runs/<registry id>-<id>``."""
        return run_dir_of(self.path, self.root, exp_id)


def run_dir_of(project_path: Path, root: Path, exp_id: int) -> Path:
    from orchestrator.records.experiments import Registry

    with Registry(project_path / ".orch" / "experiments.db") as reg:
        return root / "runs" / f"{reg.registry_id}-{exp_id}"


@pytest.fixture
def project(tmp_path: Path):
    path = tmp_path / "proj"
    path.mkdir()
    shutil.copy(EXAMPLE / "train.py", path / "train.py")
    root = tmp_path / "target"
    proj = Project(path, root)
    proj.configure()
    yield proj
    subprocess.run(["tmux", "-L", tmux_socket(str(root)), "kill-server"], capture_output=True)


def hold_registry(db: Path) -> subprocess.Popen:
    """A process holding the registry ``db``'s write lock (an open write transaction) until it is killed."""
    holder = subprocess.Popen([sys.executable, "-c",
                               "import sqlite3, sys, time\n"
                               "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
                               "db.execute('BEGIN IMMEDIATE')\n"
                               "db.execute(\"UPDATE registry_meta SET value = value WHERE key = 'id'\")\n"
                               "print('holding', flush=True)\n"
                               "time.sleep(120)\n", str(db)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
    return holder


def snapshot(*folders: Path) -> dict[str, bytes]:
    """Every file under the folders with its content, to prove an operation changed nothing."""
    out: dict[str, bytes] = {}
    for folder in folders:
        if not folder.exists():
            continue
        for p in sorted(folder.rglob("*")):
            if p.is_file() and not p.name.endswith(("-wal", "-shm")):
                out[str(p)] = p.read_bytes()
    return out


def run_on_pty(argv: list[str], cwd: Path, answers: dict[str, str], timeout: float = 120,
               env: dict | None = None) -> tuple[int, str]:
    """Run a command on a real pseudo-terminal, typing each answer when its prompt text appears.

    Returns the exit code and everything the terminal showed (stdout and stderr together).
    """
    import pty
    import select
    import time

    pid, fd = pty.fork()
    if pid == 0:  # the child: the command, with the pty as its terminal
        os.chdir(cwd)
        os.execvpe(argv[0], argv, dict(os.environ, **(env or {})))
    seen, pending = b"", dict(answers)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                seen += chunk
                for prompt in list(pending):
                    if prompt.encode() in seen:
                        os.write(fd, pending.pop(prompt).encode() + b"\r")
        else:
            os.kill(pid, 9)
            raise AssertionError(f"{argv} did not finish within {timeout} s on the pty: {seen.decode()!r}")
    finally:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), seen.decode("utf-8", "replace").replace("\r\n", "\n")




def end_conductors(locks: Iterator[Path], word: bytes) -> None:
    """SIGKILL each sweep conductor a failed test left running: the pid in each lock file, if that process's
    command line holds ``word`` (``b"conduct"`` on the controller, ``b"sweep-conduct"`` on the target)."""
    for lock in locks:
        try:
            pid = int(lock.read_text() or 0)
            if pid and word in open(f"/proc/{pid}/cmdline", "rb").read():
                os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError):
            pass
