"""The project's command as the target runs it (pure): a shell line under ``sh -c``, ``exec`` for one simple
command, a list as it is; under torchrun, the line's words kept as written."""

from __future__ import annotations

import subprocess

import pytest

from orchestrator.launch import command
from orchestrator.config import DistributedSection
from orchestrator.launch.distributed import NodeFacts, plan
from orchestrator.errors import InputError

NODES = [NodeFacts(0, "ct200", "10.77.0.200", "eth0"), NodeFacts(1, "ct201", "10.77.0.201", "eth0")]


@pytest.mark.parametrize("line, simple", [
    ("python3 train.py --out=$ORCH_CHECKPOINT_DIR", True),
    ('FOO=1 python3 "a b" --x="$D; y"', True),  # the ';' is quoted
    ("python3 t.py --when=$(date +%s)", False),  # a substitution: runs under its shell, to be safe
    ("mkdir -p $D && python3 t.py", False),
    ("python3 t.py > log 2>&1", False),
    ("python3 t.py; echo done", False),
    ("python3 a.py\npython3 b.py", False),
    ("if true; then python3 t.py; fi", False),
    ("exec python3 t.py", False),  # already exec'd: left as written
])
def test_which_lines_are_one_simple_command(line, simple):
    assert command.simple(line) is simple
    argv = command.exec_argv(line)
    assert argv[:2] == ["/bin/sh", "-c"] and argv[2] == (command.exec_line(line) if simple else line)
    assert ("exec " in argv[2] and argv[2] != line) is simple


def test_the_exec_line_runs_in_a_real_shell_with_its_variables_and_quotes():
    argv = command.exec_argv('X=inner printf "%s|" "$V" "two words" \'$V\' "$X"')
    out = subprocess.run(argv, env={"V": "v1", "PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert out.stdout == "v1|two words|$V||", out  # X= is the program's, not the line's own expansion


def test_a_list_is_never_given_a_shell():
    assert command.exec_argv(["python3", "t.py", "$HOME", "a && b"]) == ["python3", "t.py", "$HOME", "a && b"]


def test_unbalanced_quotes_and_empty_lines_are_refused():
    with pytest.raises(InputError, match="is not a shell line orch can read"):
        command.check('python3 t.py --x="open')
    with pytest.raises(InputError, match="is empty"):
        command.check("   ")


def test_torchrun_goes_after_the_interpreter_of_a_shell_line_and_the_users_words_stay_as_written():
    runs = plan(NODES, 'OMP=2 python3 -u train.py --out="$ORCH_RUN_DIR/r$ORCH_NODE_RANK" \'a b\'',
                DistributedSection(), "tinylm", 7)
    sh, c, line = runs[1].argv
    assert (sh, c) == ("/bin/sh", "-c")
    assert line.startswith("OMP=2 exec python3 -m torch.distributed.run --nnodes=2 ")
    assert "--rdzv-conf=is_host=0 --local-addr=10.77.0.201 train.py" in line
    assert line.endswith(' train.py --out="$ORCH_RUN_DIR/r$ORCH_NODE_RANK" \'a b\'')  # expanded on the node


def test_a_shell_line_that_is_not_python_goes_to_torchrun_with_no_python():
    line = plan(NODES, "./go.sh --rank=$ORCH_NODE_RANK", DistributedSection(), "p", 1)[0].argv[2]
    assert "--local-addr=10.77.0.200 --no-python ./go.sh --rank=$ORCH_NODE_RANK" in line


def test_a_line_with_operators_under_torchrun_is_refused_and_runs_as_is_without_a_launcher():
    with pytest.raises(InputError, match="the torchrun launcher cannot be put in front of it") as refused:
        plan(NODES, "cd sub && python3 train.py", DistributedSection(), "p", 1)
    assert 'launcher = "none"' in refused.value.hint
    runs = plan(NODES, "cd sub && python3 train.py", DistributedSection(launcher="none"), "p", 1)
    assert runs[0].argv == ["/bin/sh", "-c", "cd sub && python3 train.py"]
