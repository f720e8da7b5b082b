"""What a run inherits from its launch (``agent/run/launch_env``): recorded 0600 without the secrets, checked as it comes
off the wire, and taken by the supervisor (umask, limits, variables with its own pane's tmux) in a real process."""

from __future__ import annotations

import json
import os
import resource
import stat
import subprocess
import sys

import pytest

from orchestrator.agent.run import launch_env
from orchestrator.agent.serving import validate
from orchestrator.agent.protocol import AgentFailure


def test_the_record_is_the_users_alone_and_holds_no_secret(tmp_path):
    ctx = launch_env.capture({"MARKER": "A", "HF_TOKEN": "hunter2", "TMUX": "/tmp/theirs,1,0"})
    launch_env.write(str(tmp_path), ctx, {"HF_TOKEN": "hunter2"})
    path = tmp_path / launch_env.FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert b"hunter2" not in path.read_bytes() and b"/tmp/theirs" not in path.read_bytes()
    back = launch_env.read(str(tmp_path))
    assert back is not None and back["env"] == {"MARKER": "A"} and back["umask"] == ctx["umask"]
    assert back["limits"]["nofile"] == list(resource.getrlimit(resource.RLIMIT_NOFILE))


def test_a_run_of_an_older_orch_has_no_record_and_keeps_the_supervisors_environment(tmp_path):
    assert launch_env.read(str(tmp_path)) is None
    assert launch_env.apply(None) == (dict(os.environ), [])


@pytest.mark.parametrize("bad", [
    [], {"env": {"A=B": "x"}, "umask": 18}, {"env": {"A": 1}, "umask": 18}, {"env": {}, "umask": 0o1000},
    {"env": {}, "umask": 18, "limits": {"nofile": [1]}}, {"env": {}, "umask": 18, "limits": {"bogus": [1, 1]}},
    {"env": {"A": "x\0y"}, "umask": 18}])
def test_a_malformed_launch_environment_is_refused_by_name_and_never_echoed(bad):
    with pytest.raises(AgentFailure) as err:
        validate.op_args("run_start", {"launch": bad})
    assert err.value.kind == "input" and err.value.message.startswith("run_start.launch")
    assert "x\0y" not in err.value.message


def test_the_launch_counts_towards_what_the_kernel_execs():
    big = {"env": {f"V{i}": "x" * 60000 for i in range(20)}, "umask": 18, "limits": {}}
    with pytest.raises(AgentFailure, match="can be exec'd"):
        validate.op_args("run_start", {"argv": ["python3"], "env": {}, "launch": big})


# a supervisor's side in a process of its own: it takes the record, then reports what a child of it gets
TAKE = """\
import json, os, resource, subprocess, sys
from orchestrator.agent.run import launch_env
env, missed = launch_env.apply(launch_env.read(sys.argv[1]))
out = subprocess.run([sys.executable, "-c", "import json, os, resource; print(json.dumps([dict(os.environ), "
                      "resource.getrlimit(resource.RLIMIT_NOFILE), os.umask(0)]))"], env=env, capture_output=True,
                     text=True).stdout
print(json.dumps({"child": json.loads(out), "missed": missed}))
"""


def test_the_supervisor_gives_its_command_the_launchs_umask_limits_and_variables(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ctx = {"env": {"MARKER": "launch", "PATH": os.environ["PATH"], "LANG": "C.UTF-8"}, "umask": 0o027,
           "limits": {"nofile": [min(soft, 300), min(hard, 4000)]}}
    launch_env.write(str(tmp_path), ctx)
    pane = {**os.environ, "MARKER": "tmux-server", "TMUX": "/tmp/orch-sock,42,0", "TMUX_PANE": "%7"}
    done = subprocess.run([sys.executable, "-c", TAKE, str(tmp_path)], env=pane, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    child_env, limits, umask = got["child"]
    assert child_env == {"MARKER": "launch", "PATH": os.environ["PATH"], "LANG": "C.UTF-8",
                         "TMUX": "/tmp/orch-sock,42,0", "TMUX_PANE": "%7"}
    assert limits == ctx["limits"]["nofile"] and umask == 0o027 and got["missed"] == []
