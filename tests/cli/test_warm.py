"""The ``orch`` script through the warm process, as a user types it: the first command runs in its own process
and starts the warm one; later commands run in a fork of it, with the same output and exit codes, prompts on a
real terminal, Ctrl-C passed on, a killed caller taking its command down, and a changed orch never served stale."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.warm import client as warm_client
from tests.conftest import run_on_pty, wait_for

ORCH = str(Path(sys.executable).parent / "orch")


def orch(project, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([ORCH, *args], cwd=project.path, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, **(env or {})))


def forks() -> list[int]:
    """Processes running the warm process's code: the warm process and the commands forked from it."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes()
                state = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[0]
            except OSError:
                continue
            if b"orchestrator.warm.server" in cmd and str(warm_client.socket_path()).encode() in cmd \
                    and state not in (b"Z", b"X"):
                out.append(int(entry.name))
    return out


def settled() -> None:
    """Only the warm process left: the forks of the commands before have exited (a fork sends its exit code, which
    ends its caller, then closes its registry before it exits itself)."""
    wait_for(lambda: len(forks()) == 1, timeout=30, what="the forks of the commands before gone")


def warm_up(project) -> None:
    assert orch(project, "experiments", "list").returncode == 0
    wait_for(lambda: os.path.exists(warm_client.socket_path()) and forks(), timeout=30, what="the warm process")


def test_commands_run_in_a_fork_with_the_same_output_and_exit_codes(project):
    warm_up(project)
    for args in (["deploy", "--wait", "-m", "warm"], ["status"], ["experiments", "list"], ["status", "-t", "nope"],
                 ["checkpoints", "list"], ["experiments", "show", "99"]):
        here = orch(project, *args, env={"ORCH_WARM": "0"}) if args[0] != "deploy" else None
        warm = orch(project, *args)
        if here is not None:
            assert (warm.returncode, warm.stderr) == (here.returncode, here.stderr), args
            if args[0] != "status":  # status says how long ago the last line was written
                assert warm.stdout == here.stdout, args
        else:
            assert warm.returncode == 0, warm.stderr
    assert orch(project, "status", "-t", "nope").returncode == 2
    settled()
    follower = subprocess.Popen([ORCH, "logs", "--follow"], cwd=project.path, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    first = follower.stderr.readline()
    assert "following experiment 1" in first, first
    wait_for(lambda: len(forks()) == 2, timeout=10, what="the follow as the only fork")
    follower.send_signal(signal.SIGINT)  # Ctrl-C reaches the command through its caller
    out, err = follower.communicate(timeout=30)
    assert follower.returncode == 0 and "stopped following (the run goes on)" in err, err
    wait_for(lambda: len(forks()) == 1, timeout=10, what="the fork gone")
    assert orch(project, "stop").returncode == 0


def test_a_prompt_on_a_terminal_and_a_killed_caller(project):
    warm_up(project)
    assert orch(project, "deploy").returncode == 0
    wait_for(lambda: any(project.checkpoints.glob("ckpt-*")), timeout=60, what="a checkpoint")
    code, screen = run_on_pty([ORCH, "restart", "--clean-checkpoints"], project.path, {"[y/N]": "y"})
    assert code == 0 and "[y/N]:" in screen and "moved to" in screen and "experiment 2: started" in screen, screen
    settled()
    follower = subprocess.Popen([ORCH, "logs", "--follow"], cwd=project.path, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    wait_for(lambda: len(forks()) == 2, timeout=30, what="the follow running in a fork")
    follower.kill()
    follower.wait()
    wait_for(lambda: len(forks()) == 1, timeout=10, what="the killed caller's command gone too")
    assert orch(project, "stop").returncode == 0


def test_a_changed_orch_is_never_served_by_the_old_warm_process(project):
    warm_up(project)
    old = Path(warm_client.socket_path())
    source = Path(warm_client.__file__).parent / "server.py"
    st = source.stat()
    os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    try:
        new = Path(warm_client.socket_path())
        assert new != old and not new.exists()
        assert orch(project, "experiments", "list").returncode == 0  # here, not in the old process
        wait_for(lambda: new.exists(), timeout=30, what="a warm process for the changed orch")
    finally:
        os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert Path(warm_client.socket_path()) == old
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not old.exists():
        time.sleep(0.1)
    assert old.exists()  # the unchanged orch's warm process is still there for it


def test_errors_of_any_kind_come_through_with_their_own_lines_and_exit_codes(project):
    warm_up(project)
    assert orch(project, "deploy", "--wait", "-m", "before the registry broke").returncode == 0
    assert orch(project, "stop").returncode == 0
    db = project.path / ".orch" / "experiments.db"
    db.write_bytes(os.urandom(8192))  # a corrupt registry: an error of orch's own
    cases = [["status"], ["experiments", "list"], ["experiments", "show", "99999999999999999999"],
             ["--config", "/proc/self/mem", "status"]]  # a config file that cannot be read
    for args in cases:
        here = orch(project, *args, env={"ORCH_WARM": "0"})
        warm = orch(project, *args)
        assert len(forks()) >= 1  # the warm process answered it, and is still there
        assert "ended without an exit code" not in warm.stderr, (args, warm.stderr)
        assert warm.returncode == here.returncode != 0, (args, warm.stderr, here.stderr)
        assert warm.stderr.splitlines()[-1] == here.stderr.splitlines()[-1], (args, warm.stderr, here.stderr)
        if "Traceback" not in here.stderr:
            assert warm.stderr == here.stderr, args


def test_a_command_whose_warm_process_is_killed_ends_with_an_error_and_a_hint(project):
    warm_up(project)
    server = forks()[0]
    assert orch(project, "deploy").returncode == 0
    settled()
    follower = subprocess.Popen([ORCH, "logs", "--follow"], cwd=project.path, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    wait_for(lambda: len(forks()) == 2, timeout=30, what="the follow running in a fork")
    os.killpg(server, signal.SIGKILL)  # the warm process and the command it runs, as the OOM killer might
    _, err = follower.communicate(timeout=30)
    assert orch(project, "stop").returncode == 0
    assert follower.returncode == 1
    lines = err.splitlines()
    assert [line for line in lines if line.startswith("error: ")] == [
        "error: the command ended without an exit code: the warm orch process running it was killed"], err
    assert any(line.startswith("hint: ") for line in lines), err


LOADS = """
import sys
from orchestrator.warm import server
server._preload()
before = set(sys.modules)
import yaml
def parsed_again(*_a, **_k):
    raise AssertionError("a playbook parsed again")
yaml.safe_load = parsed_again
import typer.core
def built_again(*_a, **_k):
    raise AssertionError("a command line's value checks built again")
typer.core.build_runtime_param = built_again
from orchestrator.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    assert not exc.code, exc.code
print("loaded:", *sorted(m for m in set(sys.modules) - before
                         if m.split(".")[0] in ("orchestrator", "yaml", "pydantic")))
"""


def test_a_deploy_in_the_warm_process_loads_nothing_the_warm_process_could_have(project):
    """What a warm deploy would import, parse or build afresh (its modules, the playbook, typer's command and its
    value checks) is made in the warm process, once, before any command."""
    env = dict(os.environ, ORCH_WARM="0")
    for args in (["deploy", "-m", "first"], ["deploy", "-m", "second"]):  # the second stops the first
        done = subprocess.run([sys.executable, "-c", LOADS, *args], cwd=project.path, capture_output=True,
                              text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[-1] == "loaded:", f"loaded by the command, not the warm process: {done.stdout}"
    assert orch(project, "stop", env={"ORCH_WARM": "0"}).returncode == 0


def test_a_status_and_a_listing_in_the_warm_process_load_nothing_the_warm_process_could_have(project):
    """A warm status of a running run (its metric series read) and ``experiments list`` import no module afresh:
    every one they need was loaded once, in the warm process."""
    project.configure(steps=400, sleep=0.1)
    env = dict(os.environ, ORCH_WARM="0")
    assert orch(project, "deploy", "--wait", "-m", "live", env={"ORCH_WARM": "0"}).returncode == 0
    try:
        for args in (["status"], ["experiments", "list"], ["experiments", "list", "--json"]):
            done = subprocess.run([sys.executable, "-c", LOADS, *args], cwd=project.path, capture_output=True,
                                  text=True, timeout=120, env=env)
            assert done.returncode == 0, done.stderr
            assert done.stdout.splitlines()[-1] == "loaded:", f"{args}: loaded by the command: {done.stdout}"
    finally:
        assert orch(project, "stop", env={"ORCH_WARM": "0"}).returncode == 0


def test_the_warm_process_has_the_ssh_transport_loaded_without_invoke():
    """The first command after a pause connects with no keeper up: paramiko and orch's SSH transport are loaded in
    the warm process already (its one loader's way: invoke, which only a ``Match exec`` needs, held back)."""
    code = ("import sys; from orchestrator.warm import server; server._preload(); "
            "print(sorted(m for m in ('paramiko', 'orchestrator.reach.transport.ssh', 'invoke') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "['orchestrator.reach.transport.ssh', 'paramiko']"


def test_a_command_run_here_starts_the_warm_process_once_it_is_done(project):
    """The first command does its work alone: the warm process (~0.4 s of imports) starts as it ends."""
    project.configure(steps=200, sleep=0.2)
    assert orch(project, "deploy", env={"ORCH_WARM": "0"}).returncode == 0
    follower = subprocess.Popen([ORCH, "logs", "--follow"], cwd=project.path, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    assert "following experiment 1" in follower.stderr.readline()
    time.sleep(1.5)  # time enough for a warm process started with the command to show
    assert forks() == [], "a warm process started while the first command ran"
    follower.send_signal(signal.SIGINT)
    _, err = follower.communicate(timeout=30)
    assert follower.returncode == 0, err
    wait_for(lambda: os.path.exists(warm_client.socket_path()) and forks(), timeout=30, what="the warm process")
    assert orch(project, "stop").returncode == 0


def test_the_registry_is_checkpointed_after_the_answer_by_the_command_that_wrote_it(project):
    """A command in the warm process closes its registry after its exit code went back (the checkpoint that folds the
    write-ahead log into the file is upkeep): the caller has gone by then, and the command still finishes it."""
    warm_up(project)
    wal = project.path / ".orch" / "experiments.db-wal"
    for args in (["deploy", "-m", "parked"], ["status"], ["stop"]):
        done = orch(project, *args)
        assert done.returncode == 0, done.stderr
        settled()
        wait_for(lambda: not wal.exists(), timeout=30, what=f"{args[0]}'s registry closed and checkpointed")
    with sqlite3.connect(project.path / ".orch" / "experiments.db") as db:
        assert db.execute("SELECT status, message FROM experiments").fetchall() == [("stopped", "parked")]


KILLED_AS_IT_ANSWERS = """
import os, signal, sys
from orchestrator import after_answer
from orchestrator.warm import server
# the child is killed as it readies what it becomes after its answer (the keeper's socket): what a keeper's SIGKILL
# meets when the command that is becoming the keeper is still answering
after_answer.answering = lambda: os.kill(os.getpid(), signal.SIGKILL)
sys.exit(server.main(sys.argv[1:]))
"""


def test_a_command_killed_as_its_answer_goes_out_ends_with_its_own_exit_code_and_output(project):
    """The warm child sends the exit code before it readies the keeper it becomes, and the caller waits for that
    too: a kill in that moment (the keeper fault, as `orch connections close` or the OOM killer would deal it)
    leaves the command's own answer, not `the warm orch process running it was killed` after a deploy that worked."""
    path = warm_client.socket_path()
    server = subprocess.Popen([sys.executable, "-c", KILLED_AS_IT_ANSWERS, path, "60"], start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: os.path.exists(path), timeout=30, what="the warm process listening")
        for args in (["experiments", "show", "99"], ["deploy", "-m", "killed as it answers"], ["experiments", "list"]):
            warm = orch(project, *args)
            here = orch(project, *args, env={"ORCH_WARM": "0"}) if args[0] != "deploy" else None
            assert "the warm orch process running it was killed" not in warm.stderr, (args, warm.stderr)
            if here is not None:
                assert (warm.returncode, warm.stdout, warm.stderr) == (here.returncode, here.stdout, here.stderr)
            else:
                assert warm.returncode == 0 and "experiment 1" in warm.stdout + warm.stderr, warm.stderr
        assert server.poll() is None  # each command was run by a fork of it, which was killed: it serves on
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    assert orch(project, "stop", env={"ORCH_WARM": "0"}).returncode == 0


RUN_HERE_WITH_A_FINALIZER = """
import atexit, sys
atexit.register(lambda: sys.stderr.write("finalized\\n"))  # what Python's finalization would run
sys.argv = ["orch", *sys.argv[1:]]
from orchestrator.main import main
main()
"""


def test_a_command_run_here_ends_with_its_code_and_output_without_pythons_finalization(project):
    """With no warm process the command runs in the orch process itself, which ends once the command said
    everything, its exit code its own, skipping the interpreter's finalization (a tenth of a second with orch's
    modules loaded) as ``python -m orchestrator`` does."""
    for args, worked in ((["experiments", "list"], True), (["experiments", "show", "99"], False)):
        here = subprocess.run([sys.executable, "-c", RUN_HERE_WITH_A_FINALIZER, *args], cwd=project.path,
                              capture_output=True, text=True, timeout=120, env=dict(os.environ, ORCH_WARM="0"))
        module = subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=project.path, capture_output=True,
                                text=True, timeout=120, env=dict(os.environ, ORCH_WARM="0"))
        assert "finalized" not in here.stderr
        assert (here.returncode, here.stdout, here.stderr) == (module.returncode, module.stdout, module.stderr)
        assert (here.returncode == 0) == worked, here.stderr


def test_the_warm_process_reads_an_orch_toml_with_a_target_of_each_kind_before_any_command(tmp_path):
    """Its rehearsal (what pydantic builds at a model's first validation, built once before the forks) is an
    orch.toml orch reads without a word, with a target of every kind a project names."""
    from orchestrator.config import load_settings
    from orchestrator.warm import server

    (tmp_path / "orch.toml").write_text(server.REHEARSAL)
    said: list[str] = []
    settings = load_settings(tmp_path / "orch.toml", env={}, notice=said.append)
    assert said == []
    assert sorted(t.kind for t in settings.targets.values()) == ["local", "proxmox", "slurm", "ssh"]
    server._rehearse()  # and it leaves nothing behind: a folder of its own, removed


def test_a_ct_named_by_its_id_is_looked_up_with_nothing_imported_afresh():
    """A CT's remembered address is checked (a TCP connect by host name, which the socket module encodes with IDNA)
    and the machine named checked by the agent: their modules are the warm process's already."""
    code = ("import sys; from orchestrator.warm import server; server._preload(); before = set(sys.modules)\n"
            "from orchestrator.reach import targets\n"
            "from orchestrator.reach.identity import Expected\n"
            "targets._answers('localhost', 9, 0.5)\n"
            "print(sorted(set(sys.modules) - before))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
