"""A Ctrl-C while orch is still starting (imports, parsing the command line) says that nothing was done.

Before a command runs there is nothing to report but that; typer's own handling of a Ctrl-C during parsing exits
130 without a word, which a user (and the chaos test) read as a run of orch that vanished. The real CLI as a
subprocess, interrupted at points spread over its start: every exit 130 must say so.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time


def test_a_ctrl_c_at_any_point_of_the_start_says_nothing_was_done(project):
    rng = random.Random(7)
    seen = []
    for _ in range(24):
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "experiments", "list"],
                                cwd=project.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        time.sleep(rng.uniform(0.08, 0.45))
        try:
            os.killpg(proc.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
        _out, err = proc.communicate(timeout=60)
        seen.append((proc.returncode, err.decode(errors="replace")))
    interrupted = [err for code, err in seen if code == 130]
    assert interrupted, seen  # some of the signals came while it started
    assert all("interrupted" in err for err in interrupted), [err for err in interrupted if "interrupted" not in err]
    traced = [(code, err) for code, err in seen if code in (0, 130) and "Traceback" in err]
    assert not traced, traced


def test_a_ctrl_c_while_the_orch_script_loads_or_hands_its_command_on_says_nothing_was_done(project):
    """The installed script, as typed: its first commands load the warm client before anything else (and start a
    warm process), the later ones hand the command to that process. No interrupt shows a traceback of orch's."""
    from tests.cli.test_warm import ORCH, forks

    rng = random.Random(11)
    seen = []
    try:
        for _ in range(24):
            proc = subprocess.Popen([ORCH, "experiments", "list"], cwd=project.path, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True)
            time.sleep(rng.uniform(0.01, 0.12))  # a command through the warm process takes ~40 ms
            try:
                os.killpg(proc.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
            _out, err = proc.communicate(timeout=60)
            seen.append((proc.returncode, err.decode(errors="replace")))
    finally:
        for pid in forks():
            os.kill(pid, signal.SIGKILL)
    interrupted = [err for code, err in seen if code == 130]
    assert interrupted, seen
    assert all("interrupted" in err for err in interrupted), [err for err in interrupted if "interrupted" not in err]
    orchs = [err for _code, err in seen if "Traceback" in err and "/orchestrator/" in err]
    assert not orchs, orchs


AFTER_THE_COMMAND = """
import os, signal, sys
from orchestrator.cli import main as cli

exit_ = cli.click_core.Context.exit

def exit(ctx, code=0):  # typer's exit after the command returned: a Ctrl-C lands here
    if HOW == "signal":
        os.kill(os.getpid(), signal.SIGINT)
    else:
        raise KeyboardInterrupt
    return exit_(ctx, code)


def early(self, *args, **kwargs):  # typer's first step, before its own Ctrl-C handling
    raise KeyboardInterrupt

HOW = sys.argv.pop(1)
if HOW == "early":
    cli.OrchGroup._main_shell_completion = early
else:
    cli.click_core.Context.exit = exit
cli.run_as_main()
"""


def _after_the_command(project, how: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", AFTER_THE_COMMAND, how, "experiments", "list"], cwd=project.path,
                          capture_output=True, text=True, timeout=60)


def test_a_ctrl_c_after_the_command_said_what_it_did_keeps_its_exit_code(project):
    res = _after_the_command(project, "signal")
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert res.stdout == "no experiments yet (orch deploy starts one)\n" and res.stderr == "", res


def test_a_ctrl_c_typer_catches_after_the_command_says_interrupted(project):
    """One that slips in before the command is over (here raised where typer ends it) still says so."""
    res = _after_the_command(project, "raise")
    assert res.returncode == 130 and res.stderr == "interrupted\n", (res.stdout, res.stderr)


def test_a_ctrl_c_before_typer_handles_them_says_nothing_was_done(project):
    """One that lands in typer's first step (its shell-completion check), before its own Ctrl-C handling."""
    res = _after_the_command(project, "early")
    assert res.returncode == 130 and res.stderr == "interrupted: nothing was done\n", (res.stdout, res.stderr)


CALLBACK_INTERRUPTED = """
import signal, sys, time, weakref
from orchestrator.cli import main as cli
sys.unraisablehook = cli._ctrl_c_where_python_ignores_it  # as main() sets it
signal.signal(signal.SIGINT, signal.default_int_handler)

class Lock:
    pass

def callback(_ref):  # as an import lock's callback when the Ctrl-C lands in it
    raise KeyboardInterrupt

def broken(_ref):  # any other error stays Python's to print
    raise ValueError("kept")

first, second = Lock(), Lock()
refs = [weakref.ref(second, broken), weakref.ref(first, callback)]
try:
    del second, first
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pass
    print("ran on")
except KeyboardInterrupt:
    print("interrupted")
"""


def test_a_ctrl_c_that_python_would_ignore_in_a_callback_still_interrupts_the_command(tmp_path):
    """A Ctrl-C that lands in a weakref callback (an import lock's, as a module loads on first use) is one Python
    prints as ``Exception ignored`` and drops: the command ran on and exited 0. It is delivered again."""
    res = subprocess.run([sys.executable, "-c", CALLBACK_INTERRUPTED], capture_output=True, text=True, timeout=60,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert res.stdout.strip() == "interrupted", (res.stdout, res.stderr)
    assert "KeyboardInterrupt" not in res.stderr, res.stderr
    assert "ValueError: kept" in res.stderr, res.stderr
