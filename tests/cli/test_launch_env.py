"""A run's environment is its launch's, on the local target: the shell that typed ``orch deploy`` (its variables, a
venv first on its PATH, its umask, its ``ulimit``s, its locale), whichever fast path carried the command (the warm
process, a standby supervisor) and whatever long-lived process (tmux's server) an earlier launch left. The real
``orch`` script as a subprocess, real tmux, the run's own view of itself (``/proc/self``)."""

from __future__ import annotations

import json
import os
import re
import resource
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.warm import client as warm_client
from tests.conftest import tmux_socket, wait_for

ORCH = str(Path(sys.executable).parent / "orch")

# what the run prints of itself, one JSON line: the environment, folder, umask, limits and locale it got
PROBE = """\
import json, locale, os, sys, time
limits = [line for line in open("/proc/self/limits").read().splitlines()[1:]]
umask = next(l.split()[1] for l in open("/proc/self/status") if l.startswith("Umask:"))
print("PROBE " + json.dumps({"env": dict(os.environ), "cwd": os.getcwd(), "umask": umask, "limits": limits,
                            "locale": locale.setlocale(locale.LC_ALL, ""), "exe": sys.executable,
                            "encoding": sys.getfilesystemencoding()}, sort_keys=True), flush=True)
time.sleep(float(os.environ.get("PROBE_SLEEP", "60")))
"""

CONFIG = """\
default_target = "local"
[project]
name = "{name}"
sources = ["probe.py"]
command = "python3 probe.py"
env = {{ PROJECT_SAYS = "{name}" }}
[paths]
root = "{root}"
checkpoints = "{root}/ckpt-{name}"
[run]
stop_timeout = 2
term_timeout = 2
{run}
[targets.local]
kind = "local"
root = "{root}"
checkpoints = "{root}/ckpt-{name}"
"""


def make_project(folder: Path, name: str, root: Path, run: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "probe.py").write_text(PROBE)
    (folder / "orch.toml").write_text(CONFIG.format(name=name, root=root, run=run))
    return folder


def venv_like(folder: Path) -> Path:
    """A folder whose bin/ holds a python3 (this one, linked): first on PATH, it is the python a run starts."""
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "python3").symlink_to(sys.executable)
    return folder / "bin"


def shell(marker: str, bin_dir: Path, warm: bool, **extra: str) -> dict:
    """The launching shell's environment: a marker, a venv first on PATH, the warm process on or off."""
    env = {k: v for k, v in os.environ.items() if k != "ORCH_WARM"}
    env.update(MARKER=marker, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", **extra)
    if not warm:
        env["ORCH_WARM"] = "0"
    return env


def orch(cwd: Path, env: dict, *args: str, limits: dict | None = None, umask: int | None = None):
    def before() -> None:  # the shell's own ulimit and umask, as `ulimit -n 512; umask 027` would set them
        for which, value in (limits or {}).items():
            resource.setrlimit(which, value)
        if umask is not None:
            os.umask(umask)

    done = subprocess.run([ORCH, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
                          preexec_fn=before if limits or umask is not None else None)
    assert done.returncode == 0, done.stderr
    return done


def probe_of(run_dir: Path, count: int = 1) -> dict:
    """What the run printed of itself (its ``count``-th attempt's line)."""
    log = run_dir / "train.log"

    def line():
        text = log.read_text() if log.exists() else ""
        found = [ln for ln in text.split("\n")[:-1] if ln.startswith("PROBE ")]  # whole lines only
        return found[count - 1] if len(found) >= count else None

    return json.loads(wait_for(line, timeout=60, what=f"probe line {count} in {log}")[len("PROBE "):])


def newest_run(root: Path, project: str) -> Path:
    runs = [d for d in (root / "runs").iterdir()
            if json.loads((d / "experiment.json").read_text()).get("project") == project]
    return max(runs, key=lambda d: (d / "experiment.json").stat().st_mtime)


def warm_up(cwd: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ORCH_WARM"}
    orch(cwd, env, "experiments", "list")
    wait_for(lambda: os.path.exists(warm_client.socket_path()) and warm_client.processes(), timeout=30,
             what="the warm process")


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "ORCH_WARM=0"])
def test_each_run_has_its_own_launchs_marker_and_venv(project, tmp_path, warm):
    """The report: A, B, another project's A, B, restart A, each from a shell with its own marker and venv first on
    PATH; every run prints its own launch's (never the first launch's, nor the PATH of the launch before it)."""
    root = project.root
    one = make_project(project.path, "one", root)
    two = make_project(tmp_path / "two", "two", root)
    bins = {m: venv_like(tmp_path / f"venv-{m}") for m in "AB"}
    if warm:
        warm_up(one)
    steps = [("A", one, "deploy"), ("B", one, "deploy"), ("A", two, "deploy"), ("B", two, "deploy"),
             ("A", one, "restart")]
    seen = []
    for marker, folder, command in steps:
        orch(folder, shell(marker, bins[marker], warm, SHELL="/bin/sh"), command)
        got = probe_of(newest_run(root, "one" if folder == one else "two"))
        seen.append((got["env"]["MARKER"], got["env"]["PATH"].split(os.pathsep)[0], got["exe"]))
    assert seen == [(m, str(bins[m]), str(bins[m] / "python3")) for m, _f, _c in steps]
    if warm:  # the commands went through the warm process
        assert warm_client.processes()
    # a window opened in a session after attach is a shell with its run's environment, not the tmux server's (the
    # first launch's: A)
    assert window_sees(root, "two", tmp_path) == f"B {bins['B'] / 'python3'} 2"
    for folder in (one, two):
        orch(folder, shell("A", bins["A"], warm), "stop")


def window_sees(root: Path, project: str, tmp_path: Path) -> str:
    """What a shell in a new window of the project's session (tmux's new-window, as after orch attach) says of its
    MARKER, python3 and experiment."""
    out = tmp_path / f"window-{project}.txt"
    tmux = ["tmux", "-L", tmux_socket(str(root))]
    made = subprocess.run([*tmux, "new-window", "-d", "-P", "-F", "#{window_id}", "-t", f"=orch-{project}:"],
                          capture_output=True, text=True, check=True).stdout.strip()
    line = f'printf "%s %s %s" "$MARKER" "$(command -v python3)" "$ORCH_EXPERIMENT_ID" > {out}; exit'
    subprocess.run([*tmux, "send-keys", "-t", made, line, "Enter"], check=True)
    return wait_for(lambda: out.exists() and out.read_text(), timeout=30, what="the new window's shell")


def normalised(text: str, roots: list[Path]) -> str:
    """A command's output or a run's record with what differs between two equal launches taken out: folders (the
    longest first), the registry's id, times and durations."""
    for i, root in enumerate(roots):
        text = text.replace(str(root), f"<root{i}>")
    text = re.sub(r"\b[0-9a-f]{12}-(\d+)\b", r"<reg>-\1", text)
    text = re.sub(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d(:\d\d)?", "<time>", text)
    return re.sub(r"\b\d+(\.\d+)?\s?(ms|s|m|h|min|seconds?|minutes?)( ago)?\b", "<dur>", text)


# what orch adds to the launching shell's variables: [project] env, the run's own, and the batching library on
# PYTHONPATH
ADDED = {"PROJECT_SAYS", "PYTHONUNBUFFERED", "PYTHONPATH", "ORCH_EXPERIMENT_ID", "ORCH_RUN_DIR", "ORCH_WORK_DIR",
         "ORCH_CHECKPOINT_DIR", "ORCH_BATCHING_FILE", "ORCH_REVISION", "ORCH_ATTEMPT", "ORCH_RESUME_FROM"}
# what legitimately differs between the fast path and the plain one: the variables that choose the path, and the
# pane's own tmux (its server's socket and pid, the pane's number)
CHOOSING = ("ORCH_WARM", "ORCH_RUN__STANDBY")
PANE = ("TMUX", "TMUX_PANE")


def standby_pid(root: Path) -> int | None:
    """The standby supervisor waiting for the next start (its pid), if one is up."""
    path = root / "standby" / "standby.json"
    if not path.exists():
        return None
    return json.loads(path.read_text())["pid"]


def launches(base: Path, fast: bool) -> dict:
    """A stale launch from another shell, then deploy, restart, a queued deploy (started as the restart's run ends)
    and exec, from shells with their own marker, venv, umask, open-file limit and locale: what each run got of
    itself, the shell it was launched from, and what each command printed."""
    root = base / "target"
    folder = make_project(base / "proj", "same", root)
    venv = venv_like(base / "venv")
    if fast:
        warm_up(folder)
    choose = {} if fast else {"ORCH_RUN__STANDBY": "false"}
    stale = shell("stale", venv_like(base / "stale"), fast, LC_ALL="C", **choose)
    env = shell("marker", venv, fast, LC_ALL="C.UTF-8", LANG="C.UTF-8", **choose)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    typed = {"limits": {resource.RLIMIT_NOFILE: (min(soft, 512), hard)}, "umask": 0o027}
    said = []
    # each launch from a shell of its own: the second ends by itself (the queued third starts then), the third is
    # queued from a shell that has its own marker
    shells = [env, env | {"PROBE_SLEEP": "6"}, env | {"MARKER": "queued"}]
    try:
        # the tmux server, and the standby on the fast path, start with this shell's: no later run may see it
        orch(folder, stale, "deploy", "-m", "stale", limits={resource.RLIMIT_NOFILE: (min(soft, 256), hard)},
             umask=0o002)
        taken = []  # whether a standby supervisor took each started run
        for args, typing in zip((["deploy", "-m", "first"], ["restart", "-m", "second"],
                                 ["deploy", "--queue", "-m", "third"]), shells):
            if fast:  # a start before the standby is up goes the plain way
                wait_for(lambda: standby_pid(root), timeout=30, what="the standby left by the start before")
            waiting = standby_pid(root)
            done = orch(folder, typing, *args, **typed)
            said.append((args[0], done.stdout, done.stderr))
            if "--queue" in args:  # the entry holds the launch's variables until it starts: the user's alone
                recorded = [stat.S_IMODE(p.stat().st_mode) for p in (root / "queue" / "same").glob("*.json")
                            if not p.name.startswith(".")]  # the entries, not why the oldest waits
                assert recorded == [0o600]
            else:
                pids = json.loads((newest_run(root, "same") / "pid.json").read_text())
                taken.append(waiting is not None and pids["supervisor"] == waiting)
        key = newest_run(root, "same").name.rsplit("-", 1)[0]
        runs = [(probe_of(root / "runs" / f"{key}-{i}"), typing) for i, typing in zip((2, 3, 4), shells)]
        shown = orch(folder, env, "exec", "--", "python3", "-c",
                     "import os, sys; print(os.environ['MARKER'], sys.executable)", **typed)
        said.append(("exec", shown.stdout, shown.stderr))
        said.append(("stop", *orch(folder, env, "stop").stdout.split("\n", 1)))
        recorded = [stat.S_IMODE((root / "runs" / f"{key}-{i}" / "launch-env.json").stat().st_mode)
                    for i in (2, 3, 4)]
    finally:
        subprocess.run(["tmux", "-L", tmux_socket(str(root)), "kill-server"], capture_output=True)
    assert recorded == [0o600] * 3  # the user's variables: theirs alone
    assert taken == [fast, fast]  # the fast path's starts went to the standby, the plain path's never
    return {"env": env, "runs": runs, "said": said, "roots": [root, venv.parent, base], "venv": venv}


def test_the_warm_process_and_the_standby_change_nothing_a_run_gets_or_a_command_prints(tmp_path):
    """Each run gets its launching shell's environment (with [project] env and orch's variables), folder, umask,
    limits and locale, never the stale shell's that started tmux's server and the standby; the same through the
    warm process and the standby as the plain way (ORCH_WARM=0, [run] standby = false), and every command prints
    the same."""
    results = {path: launches(tmp_path / path, path == "fast") for path in ("fast", "plain")}
    for path, got in results.items():
        for run, env in got["runs"]:
            assert run["cwd"] == run["env"]["ORCH_WORK_DIR"] == run["env"]["PWD"]  # the command's shell sets PWD
            mine = {k: v for k, v in run["env"].items() if k not in PANE and k != "PWD"}
            assert set(mine) - set(env) == ADDED - set(env), path
            assert {k: v for k, v in mine.items() if k in env and k not in ADDED} == \
                {k: v for k, v in env.items() if k not in ADDED and k != "PWD"}, path
            assert (run["umask"], run["exe"], run["locale"]) == ("0027", str(got["venv"] / "python3"), "C.UTF-8")
            assert any(re.match(r"Max open files\s+512\s", line) for line in run["limits"]), run["limits"]
        assert got["said"][3][1].split() == ["marker", str(got["venv"] / "python3")]  # exec agrees with the runs

    def comparable(got: dict) -> list:
        runs = [{**r, "env": {k: v for k, v in r["env"].items() if k not in PANE + CHOOSING}} for r, _ in got["runs"]]
        return json.loads(normalised(json.dumps([runs, got["said"]]), got["roots"]))

    assert comparable(results["fast"]) == comparable(results["plain"])


def test_a_restart_by_the_supervisor_and_a_resume_after_a_reboot_keep_the_launchs_environment(project, tmp_path):
    """The second attempt, and the attempt a reboot unit starts (``agent resume``, from an environment of its own),
    get what the launch had, not what the process that starts them has."""
    root = project.root
    folder = make_project(project.path, "one", root, run='restarts = 1\nrestart_on = "always"\nbackoff = [0]\n'
                                                       "resume_after_reboot = true")
    bin_dir = venv_like(tmp_path / "venv")
    orch(folder, shell("A", bin_dir, False, PROBE_SLEEP="0.2"), "deploy", umask=0o027)
    run_dir = newest_run(root, "one")
    first, second = probe_of(run_dir), probe_of(run_dir, 2)
    assert first["env"]["ORCH_ATTEMPT"] == "0" and second["env"]["ORCH_ATTEMPT"] == "1"
    for got in (first, second):
        assert (got["env"]["MARKER"], got["exe"], got["umask"]) == ("A", str(bin_dir / "python3"), "0027")
    wait_for(lambda: (run_dir / "exit.json").exists(), timeout=60, what="the run's end")
    # the machine went down under a run: no exit recorded, nothing alive; its unit resumes it at boot
    (run_dir / "exit.json").unlink()
    (run_dir / "train.log").write_text("")
    subprocess.run(["tmux", "-L", tmux_socket(str(root)), "kill-server"], capture_output=True)
    agent = json.loads((run_dir / "launch.json").read_text())["env"]["PYTHONPATH"].split(os.pathsep)[-1]
    agent = agent[:-2] + ".pyz" if agent.endswith(".d") else agent
    boot = {**os.environ, "MARKER": "the-units-own"}
    done = subprocess.run([sys.executable, agent, "resume", str(run_dir)], capture_output=True, text=True,
                          timeout=60, env=boot)
    assert done.returncode == 0, done.stderr
    resumed = probe_of(run_dir)
    assert (resumed["env"]["MARKER"], resumed["exe"], resumed["umask"]) == ("A", str(bin_dir / "python3"), "0027")
