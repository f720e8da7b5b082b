"""``[project] command`` as users write it, on the local target (real tmux, the real CLI): a string is a shell
line (``$VAR``s, quotes, ``&&``, redirects), a list runs without a shell; the run's PYTHONPATH keeps the user's;
``orch exec`` of a missing program; a command the target would refuse stops nothing."""

from __future__ import annotations

import json
import signal

import pytest

from tests.cli.test_shared_target import clones  # noqa: F401  (the fixture)
from tests.conftest import wait_for
from tests.integration.test_frozen_ct import GRACEFUL

# writes its arguments and where it ran, then exits
ARGS = ("import json, os, sys\n"
        "out = sys.argv[1].split('=', 1)[1] if sys.argv[1:] and sys.argv[1].startswith('--out=') \\\n"
        "    else os.environ['ORCH_RUN_DIR']\n"
        "os.makedirs(out, exist_ok=True)\n"
        "json.dump({'argv': sys.argv[1:], 'cwd': os.getcwd()}, open(os.path.join(out, 'args.json'), 'w'))\n"
        "print('to the side log', flush=True)\n")

LONG = "import time\nwhile True:\n    print('step=1 loss=1.0', flush=True)\n    time.sleep(0.2)\n"


def use(project, command, script: str = ARGS, env: str | None = None) -> None:
    """The project runs ``job.py`` (``script``) with ``command`` (a TOML value: a string or a list)."""
    (project.path / "job.py").write_text(script)
    text = (project.path / "orch.toml").read_text()
    text = text.replace('sources = ["train.py"]', 'sources = ["job.py"]')
    text = "\n".join(f"command = {json.dumps(command)}" if x.startswith("command = ") else x
                     for x in text.splitlines()) + "\n"
    if env is not None:
        text = text.replace('env = { ', f"env = {{ {env}, ", 1)
    (project.path / "orch.toml").write_text(text)


def finished(project, exp_id: int = 1) -> dict:
    def ended():
        res = project.run("status", "--json", "--no-metrics")
        data = json.loads(res.stdout)
        return data if data["state"] not in ("running", "launching") else None
    return wait_for(ended, timeout=60, what=f"experiment {exp_id} to end")


def test_a_string_command_is_a_shell_line_with_the_runs_variables(project):
    line = ('mkdir -p $ORCH_CHECKPOINT_DIR/x && python3 job.py --out=${ORCH_CHECKPOINT_DIR}/x "two words" '
            '> $ORCH_RUN_DIR/side.log 2>&1; echo "done $ORCH_EXPERIMENT_ID"')
    use(project, line)
    dry = project.run("deploy", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"start `{line}` as /bin/sh -c '" in dry.stdout, dry.stdout  # as written, and how it runs
    res = project.run("deploy")
    assert res.returncode == 0, res.stderr
    data = finished(project)
    assert (data["state"], data["exit_code"]) == ("finished", 0), data
    ran = json.loads((project.checkpoints / "x" / "args.json").read_text())
    assert ran["argv"] == [f"--out={project.checkpoints}/x", "two words"]  # expanded, the quoted words one
    assert (project.run_dir(1) / "side.log").read_text() == "to the side log\n"  # the redirect
    log = (project.run_dir(1) / "train.log").read_text()
    assert "done 1" in log and "to the side log" not in log
    shown = project.run("experiments", "show", "1")
    assert line in shown.stdout, shown.stdout
    record = json.loads(project.run("experiments", "show", "1", "--json").stdout)
    assert record["command"] == line  # recorded as written


def test_a_list_command_runs_without_a_shell(project):
    command = ["python3", "job.py", "$HOME", "a && b > c"]
    use(project, command)
    dry = project.run("deploy", "--dry-run")
    assert "start `python3 job.py '$HOME' 'a && b > c'` in tmux" in dry.stdout, dry.stdout
    assert project.run("deploy").returncode == 0
    data = finished(project)
    assert data["state"] == "finished", data
    ran = json.loads((project.run_dir(1) / "args.json").read_text())
    assert ran["argv"] == ["$HOME", "a && b > c"]  # no shell: nothing expanded, nothing run
    record = json.loads(project.run("experiments", "show", "1", "--json").stdout)
    assert record["command"] == command


@pytest.mark.parametrize("line", ["python3 job.py --tag=$ORCH_EXPERIMENT_ID",
                                  "echo starting; python3 job.py && echo never"])
def test_a_shell_line_run_stops_gracefully_with_its_final_checkpoint(project, line):
    use(project, line, script=GRACEFUL)
    assert project.run("deploy").returncode == 0
    log = project.run_dir(1) / "train.log"
    wait_for(lambda: log.exists() and "step=3" in log.read_text(), what="the run's first steps")
    stop = project.run("stop")
    assert stop.returncode == 0, stop.stderr
    assert "signals: SIGINT)" in stop.stdout, stop.stdout  # SIGINT was enough: python got it
    assert (project.checkpoints / "final.pt").read_text() == "done"
    assert "final checkpoint written" in log.read_text() and "never" not in log.read_text()
    record = json.loads(project.run("experiments", "show", "1", "--json").stdout)
    assert record["status"] == "stopped"
    ended = json.loads((project.run_dir(1) / "exit.json").read_text())
    # one simple command is exec'd: its own exit code; a compound line ends as its shell did (SIGINT)
    assert ended["exit_code"] == (0 if "&&" not in line else 128 + signal.SIGINT), ended


def test_a_command_too_long_for_the_target_stops_nothing_of_either_clone(clones):  # noqa: F811
    a, b = clones
    for p in (a, b):
        use(p, "python3 job.py", script=LONG)
    assert a.run("deploy").returncode == 0
    before = a.run_dir(1) / "pid.json"
    wait_for(before.exists, what="clone A's run")
    huge = "python3 job.py " + "--flag=" + "x" * 100_000
    for p in (a, b):
        use(p, huge, script=LONG)
        for args in (["deploy"], ["deploy", "--dry-run"]):
            res = p.run(*args)
            assert res.returncode == 2, res.stdout + res.stderr
            assert "error: [project] command" in res.stderr and "at most 4096" in res.stderr, res.stderr
            assert "hint:" in res.stderr and "update orch" not in res.stderr, res.stderr
    assert len(a.registry().list()) == 1 and b.registry().list() == []  # no new row
    data = json.loads(a.run("status", "--json", "--no-metrics").stdout)
    assert (data["experiment"], data["state"]) == (1, "running"), data
    assert not (a.run_dir(1) / "stop_requested").exists()


def test_an_environment_too_big_to_exec_is_refused_before_anything(project):
    use(project, "python3 job.py", script=LONG, env=f'BIG = "{"y" * 200_000}"')
    res = project.run("deploy")
    assert res.returncode == 2, res.stderr
    assert "error: [project] env BIG is over 131072 bytes" in res.stderr, res.stderr
    assert "hint:" in res.stderr
    assert not (project.root / "runs").exists() and project.registry().list() == []


def test_a_secret_expanded_in_the_line_is_refused(project, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "s3cret-value")
    use(project, "python3 job.py --token=${HF_TOKEN}")
    toml = project.path / "orch.toml"
    toml.write_text(toml.read_text().replace('sources = ["job.py"]', 'sources = ["job.py"]\nsecrets = ["HF_TOKEN"]'))
    res = project.run("deploy")
    assert res.returncode == 2, res.stderr
    assert "expands secret HF_TOKEN" in res.stderr and "s3cret-value" not in res.stdout + res.stderr
    assert project.registry().list() == []


def test_pythonpath_from_project_env_is_joined_with_orchs(project, tmp_path):
    lib = tmp_path / "userlib"
    lib.mkdir()
    (lib / "usermod.py").write_text("WHO = 'user module'\n")
    script = ("import os, usermod, orchestrator.batching\n"
              "print(usermod.WHO, orchestrator.batching.__name__, os.environ['PYTHONPATH'], flush=True)\n")
    use(project, "python3 job.py", script=script, env=f'PYTHONPATH = "{lib}"')
    assert project.run("deploy").returncode == 0
    data = finished(project)
    log = (project.run_dir(1) / "train.log").read_text()
    assert data["state"] == "finished", log
    line = next(x for x in log.splitlines() if x.startswith("user module"))
    assert line.split()[3].split(":")[0] == str(lib)  # the user's first, orch's after


def test_exec_of_a_missing_program_says_so_with_127(project):
    use(project, "python3 job.py", script=LONG)
    assert project.run("deploy").returncode == 0
    res = project.run("exec", "--", "no-such-program-x", "--version")
    assert res.returncode == 127, res.stdout + res.stderr
    assert "error: no-such-program-x: command not found on " in res.stderr, res.stderr
    assert "hint: install no-such-program-x on the target" in res.stderr
    assert "sh: " not in res.stderr
    missing = project.run("exec", "--", "./not-in-the-revision.sh")
    assert missing.returncode == 127 and "error: ./not-in-the-revision.sh: command not found" in missing.stderr
    ok = project.run("exec", "--", "python3", "-c", "import os; print(os.getcwd())")
    assert ok.returncode == 0 and ok.stdout.strip() == str(project.run_dir(1) / "work"), ok.stdout + ok.stderr


def test_a_playbook_shell_step_the_agent_would_refuse_stops_nothing(project):
    use(project, "python3 job.py", script=LONG)
    assert project.run("deploy").returncode == 0
    wait_for((project.run_dir(1) / "pid.json").exists, what="the first run")
    (project.path / "playbooks").mkdir()
    steps = ["preflight", "push_revision", "stop_run", "checkpoints", "record", "start_run", "verify_started"]
    body = "".join(f"  - step: {s}\n" for s in steps[:3])
    body += f'  - step: shell\n    argv: ["echo", "{"z" * 5000}"]\n' + "".join(f"  - step: {s}\n" for s in steps[3:])
    (project.path / "playbooks" / "deploy.yaml").write_text("name: deploy\nsteps:\n" + body)
    res = project.run("deploy")
    assert res.returncode == 2, res.stdout + res.stderr
    assert "error: playbook deploy shell step argv[1] is 5000 characters long; the target takes at most 4096" \
        in res.stderr, res.stderr
    assert len(project.registry().list()) == 1 and not (project.run_dir(1) / "stop_requested").exists()


def test_a_setting_out_of_the_agents_range_is_refused_with_its_key(project):
    res = project.run("deploy", "--set", "run.stop_timeout=1e12")
    assert res.returncode == 2, res.stdout + res.stderr
    assert "error: [run] stop_timeout = 1e+12 is out of range; at most 1e+09 seconds" in res.stderr, res.stderr
    assert project.registry().list() == [] and not (project.root / "runs").exists()
