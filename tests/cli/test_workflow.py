"""The workflow as users type it on the local target: bare commands after a launch named by flags,
`orch use`, `--wait`, Ctrl-C at several points, per-project checkpoints, dry runs that look.

Everything goes through the real CLI (in-process, as a subprocess, and on a pseudo-terminal),
real tmux and a real registry.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import REPO, STUBBORN, run_dir_of, run_on_pty, tmux_socket, wait_for

TWO_TARGETS = """
[targets.other]
kind = "local"
root = "{root}"
checkpoints = "{root}/checkpoints/{{project}}"
"""


def cli_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator.cli.main", *args]


def test_bare_commands_follow_the_target_of_the_last_launch(project, tmp_path):
    other = tmp_path / "other-root"
    project.configure(steps=100000, sleep=0.01, extra=TWO_TARGETS.format(root=other))
    try:
        res = project.run("deploy", "--target", "other", "-m", "on the other target")
        assert res.returncode == 0, res.stderr
        assert "started on other" in res.stdout
        # bare status, checkpoints and logs act on "other", not on default_target = "local"
        status = json.loads(project.run("status", "--json").stdout)
        assert status["target"] == "other" and status["experiment"] == 1 and status["state"] == "running"
        wait_for(lambda: any((other / "checkpoints" / "tinylm").glob("ckpt-*")), what="a checkpoint")
        listing = project.run("checkpoints", "list")
        assert listing.returncode == 0 and str(other / "checkpoints" / "tinylm") in listing.stdout
        # restart --clean-checkpoints as typed on a terminal: the prompt appears and is answered
        code, screen = run_on_pty(cli_argv("restart", "--clean-checkpoints"), project.path,
                                  {"move to the trash": "y"})
        assert code == 0, screen
        assert "on other" in screen and "experiment 2" in screen
        exp2 = project.registry().get(2)
        assert exp2.parent == 1 and exp2.target == "other" and exp2.checkpoints_action == "moved"
        # the trash entry is named after the experiment whose checkpoints it holds, and says who moved them
        entry = Path(exp2.checkpoints_entry)
        assert entry.name.endswith("-exp1")
        assert json.loads((entry / ".orch-trash.json").read_text())["moved_by"] == 2
        assert not (project.root / "runs").exists()  # nothing went to default_target's root
        stop = project.run("stop")
        assert stop.returncode == 0 and "experiment 2 on other: stopped" in stop.stdout
        # logs --follow, bare, ends with the run it follows
        follow = project.run("logs", "--follow", "-n", "1", timeout=60)
        assert follow.returncode == 0, follow.stderr
        assert "following experiment 2 on other" in follow.stderr and "experiment 2 stopped" in follow.stderr
    finally:
        subprocess.run(["tmux", "-L", tmux_socket(str(other)), "kill-server"], capture_output=True)


def test_orch_use_sets_and_shows_the_current_target(project, tmp_path):
    project.configure(extra=TWO_TARGETS.format(root=tmp_path / "o"))
    assert "current target: local (target local, default_target in orch.toml)" in project.cli("use").stdout
    res = project.cli("use", "other")
    assert res.exit_code == 0 and "current target: other" in res.stdout
    assert "chosen by a deploy or orch use" in project.cli("use").stdout
    assert json.loads(project.cli("status", "--json").stdout)["target"] == "other"
    bad = project.cli("use", "nope")
    assert bad.exit_code == 2 and "unknown target 'nope'" in bad.output
    # the current target vanished from orch.toml: a clear error, not a silent fallback
    project.configure()
    gone = project.cli("status")
    assert gone.exit_code == 2 and "no longer in orch.toml" in gone.output and "orch use" in gone.output
    assert project.cli("use", "local").exit_code == 0
    assert project.cli("status").exit_code == 0


def test_deploy_wait_fails_on_a_crash_after_a_slow_start(project):
    (project.path / "slow_crash.py").write_text(
        "import sys, time\nprint('loading', flush=True)\ntime.sleep(1.5)\n"
        "print('Traceback: out of memory', file=sys.stderr, flush=True)\nsys.exit(3)\n")
    project.configure()
    args = ["--set", "project.sources=['slow_crash.py']", "--set", "project.command=python3 slow_crash.py"]
    plain = project.run("deploy", *args)
    assert plain.returncode == 0 and "started on local" in plain.stdout  # it cannot know yet, and says so
    res = project.run("deploy", *args, "--wait")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "crashed on local (exit code 3)" in res.stderr and "out of memory" in res.stderr
    assert project.registry().get(2).status == "crashed" and project.registry().get(2).exit_code == 3


def test_deploy_wait_reports_the_first_metric_line(project):
    project.configure(steps=100000, sleep=0.01)
    res = project.run("deploy", "--wait=30")
    assert res.returncode == 0, res.stderr
    assert "experiment 1: running on local" in res.stdout and "first metrics after" in res.stdout
    assert "step=" in res.stdout
    assert project.run("stop").returncode == 0


def _deploy_proc(project, *args: str) -> subprocess.Popen:
    return subprocess.Popen(cli_argv("deploy", *args), cwd=project.path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_ctrl_c_while_waiting_for_the_target_changes_nothing(project):
    project.configure(steps=100000, sleep=0.01, lock_timeout=20)
    project.root.mkdir(parents=True)
    with open(project.root / ".lock", "w") as held:  # another operation holds the target
        fcntl.flock(held, fcntl.LOCK_EX)
        proc = _deploy_proc(project)
        wait_for(lambda: project.registry().list() if (project.path / ".orch" / "experiments.db").exists()
                 else False, what="the experiment row")
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        time.sleep(1.0)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted: nothing was changed on the target" in err
    assert project.registry().get(1).status == "failed"
    time.sleep(1.0)  # the cancelled agent must not run the deploy once the lock is free
    assert not (project.run_dir(1)).exists()


def test_ctrl_c_while_the_old_run_stops_starts_the_new_one_and_says_how_to_go_back(project):
    """The stop in progress finishes, and the target goes on to the start (a launch cut between them would leave
    neither run): one run of the project runs, and orch says so, with the command that puts the old one back."""
    (project.path / "stubborn.py").write_text(STUBBORN)
    project.configure(lock_timeout=20)
    args = ["--set", "project.sources=['stubborn.py']", "--set", "project.command=python3 stubborn.py"]
    assert project.run("deploy", *args).returncode == 0
    proc = _deploy_proc(project, *args)
    wait_for(lambda: (project.run_dir(1) / "stop_requested").exists(), what="the stop of run 1")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted: new run 2 started (running); old run 1 stopped; to go back: orch restart -e 1" in err, err
    reg = project.registry()
    assert reg.get(1).status == "stopped" and reg.get(2).status == "running"
    assert reg.get(2).checkpoints_action == "kept"  # a deploy without --clean-checkpoints never touches them
    journal = [json.loads(line) for line in (project.run_dir(2) / "journal.jsonl").read_text().splitlines()]
    done = [e["op"] for e in journal if e["event"] == "done"]
    assert done.index("run_stop") < done.index("run_start") and journal[-1]["event"] == "end", done
    assert json.loads(project.run("status", "--json").stdout)["state"] == "running"
    assert project.run("stop").returncode == 0


def test_ctrl_c_during_wait_leaves_the_new_run_running_and_recorded(project):
    (project.path / "quiet.py").write_text("import time\nwhile True:\n    time.sleep(0.2)\n")
    project.configure()
    proc = _deploy_proc(project, "--set", "project.sources=['quiet.py']", "--set",
                        "project.command=python3 quiet.py", "--wait=60")
    wait_for(lambda: (project.run_dir(1) / "pid.json").exists(), what="the run to start")
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "experiment 1 was started on local and goes on" in err
    assert project.registry().get(1).status == "running"
    assert project.run("stop").returncode == 0


PER_PROJECT = """\
default_target = "local"

[project]
name = "{name}"
sources = ["train.py"]
command = "python3 train.py"
env = {{ OMP_NUM_THREADS = "1", TINYLM_STEPS = "100000", TINYLM_CKPT_EVERY = "5", TINYLM_SLEEP = "0.01", TINYLM_SAMPLES = "600" }}

[batching]
token_budget = 4096
max_seq_len = 512

[paths]
checkpoints = "{root}/checkpoints/{{project}}"   # as the default under /workspace: one folder per project

[run]
stop_timeout = 5
term_timeout = 3

[targets.local]
kind = "local"
root = "{root}"
"""


def test_two_projects_on_one_target_keep_their_checkpoints_apart(tmp_path):
    root = tmp_path / "shared-root"
    projects = []
    for name in ("alpha", "beta"):
        path = tmp_path / name
        path.mkdir()
        (path / "train.py").write_bytes((REPO / "examples" / "tinylm" / "train.py").read_bytes())
        (path / "orch.toml").write_text(PER_PROJECT.format(name=name, root=root))
        projects.append(path)

    def orch(path, *args):
        return subprocess.run(cli_argv(*args), cwd=path, capture_output=True, text=True, timeout=120)

    try:
        res = orch(projects[0], "deploy")
        assert res.returncode == 0, res.stderr
        alpha_ckpt = Path(json.loads(orch(projects[0], "experiments", "show", "1", "--json").stdout)["checkpoints"])
        wait_for(lambda: any(alpha_ckpt.glob("ckpt-*")), what="alpha's checkpoints")
        res = orch(projects[1], "deploy", "--json")
        assert res.returncode == 0, res.stderr
        beta = json.loads(res.stdout)["experiment"]
        assert beta["checkpoints"] != str(alpha_ckpt) and beta["checkpoints"].endswith("/beta")
        assert "checkpoints:" not in res.stderr  # nothing of alpha's was offered to beta's run
        time.sleep(1.0)
        log = (run_dir_of(projects[1], root, beta["id"]) / "train.log").read_text()
        assert "resumed from" not in log
        # the same project deployed again is told its run will see what is there, and who wrote it
        again = orch(projects[0], "deploy")
        assert again.returncode == 0, again.stderr
        assert f"holds" in again.stderr and "written by experiment 1" in again.stderr
        assert "the run will see them" in again.stderr
    finally:
        subprocess.run(["tmux", "-L", tmux_socket(str(root)), "kill-server"], capture_output=True)


def test_an_optional_shell_step_whose_program_is_missing_is_skipped(project):
    (project.path / "playbooks").mkdir()
    (project.path / "playbooks" / "deploy.yaml").write_text(
        "name: deploy\nsteps:\n  - step: preflight\n  - step: shell\n    argv: [orch-test-no-such-program, -L]\n"
        "    check: false\n  - step: push_revision\n  - step: stop_run\n  - step: checkpoints\n  - step: record\n"
        "  - step: start_run\n  - step: verify_started\n")
    project.configure(steps=5)
    res = project.run("deploy")
    assert res.returncode == 0, res.stderr
    assert "warning: shell step skipped: 'orch-test-no-such-program' is not installed" in res.stderr
    strict = (project.path / "playbooks" / "deploy.yaml").read_text().replace("check: false", "check: true")
    (project.path / "playbooks" / "deploy.yaml").write_text(strict)
    res = project.run("deploy")
    assert res.returncode == 2 and "is not installed on the target" in res.stderr


def test_dry_run_looks_at_the_target_and_changes_nothing(project):
    from tests.conftest import snapshot

    project.configure(steps=100000, sleep=0.01)
    assert project.cli("deploy").exit_code == 0
    wait_for(lambda: any(project.checkpoints.glob("ckpt-*")), what="a checkpoint")
    (project.path / "extra.txt").write_text("x" * 5000)
    project.configure(steps=100000, sleep=0.01, extra="")
    before = snapshot(project.path / ".orch", project.root / "runs")
    before = {k: v for k, v in before.items() if "hashes.json" not in k}  # a local cache of file hashes
    res = project.cli("deploy", "--dry-run", "--clean-checkpoints", "--set",
                      "project.sources=['train.py', 'extra.txt']")
    assert res.exit_code == 0, res.output
    assert "would stop: experiment 1" in res.stdout
    assert f"checkpoints {project.checkpoints}:" in res.stdout and "moved to the trash" in res.stdout
    assert "would send: 1 of 2 file(s), 4.9 KB" in res.stdout
    after = snapshot(project.path / ".orch", project.root / "runs")
    growing = ("train.log", "metrics.jsonl", "metrics.state.json")  # the live run's log and the series kept of it
    assert {k: v for k, v in after.items() if "hashes.json" not in k and not k.endswith(growing)} == \
        {k: v for k, v in before.items() if not k.endswith(growing)}
    assert project.registry().get(1).status == "running" and len(project.registry().list()) == 1
    assert project.cli("stop").exit_code == 0


def test_metrics_settings_given_at_deploy_govern_how_status_reads_the_run(project):
    (project.path / "odd.py").write_text(
        "import time\nfor i in range(1, 4):\n    print(f'it {i} L={i / 10:.2f}', flush=True)\ntime.sleep(60)\n")
    project.configure()
    res = project.cli("deploy", "--set", "project.sources=['odd.py']", "--set", "project.command=python3 odd.py",
                      "--set", "metrics.patterns={ loss = 'L=([0-9.]+)', step = 'it ([0-9]+)' }")
    assert res.exit_code == 0, res.output

    def status():
        return json.loads(project.cli("status", "--json").stdout)["summary"]

    wait_for(lambda: status().get("step") == 3, what="step 3 read with the deploy's patterns")
    assert status()["loss"] == 0.3
    assert project.cli("stop").exit_code == 0
