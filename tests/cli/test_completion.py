"""Shell completion: typer's --show-completion / --install-completion, tried in a real bash."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


@pytest.fixture
def env(tmp_path: Path) -> dict:
    if not (BIN / "orch").exists():
        pytest.skip("the orch entry point is not installed beside this python")
    return dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", HOME=str(tmp_path),
                SHELL="/bin/bash")


def bash(script: str, env: dict) -> subprocess.CompletedProcess:
    """``script`` in bash, with bash staying orch's parent (never exec'd away), as in a user's terminal:
    typer finds the shell to complete for by walking up the process tree."""
    return subprocess.run(["bash", "-c", script + "\nexit $?"], capture_output=True, text=True, env=env,
                          timeout=60)


def test_show_completion_prints_a_bash_script_that_completes_commands_and_flags(env):
    shown = bash("orch --show-completion", env)
    assert shown.returncode == 0, shown.stderr
    assert "complete -o default -F _orch_completion orch" in shown.stdout
    words = {"orch g": ("1", "gc"), "orch checkpoints pu": ("2", "purge"), "orch gc --dr": ("2", "--dry-run")}
    for line, (cword, expected) in words.items():
        got = bash(f'source <(orch --show-completion); COMP_WORDS=({line}); COMP_CWORD={cword}; '
                   '_orch_completion orch; printf "%s\\n" "${COMPREPLY[@]}"', env)
        assert got.returncode == 0, got.stderr
        assert expected in got.stdout.split(), (line, got.stdout)


def test_install_completion_writes_the_script_and_sources_it(env):
    done = bash("orch --install-completion", env)
    assert done.returncode == 0, done.stderr
    script = Path(env["HOME"]) / ".bash_completions" / "orch.sh"
    assert "_orch_completion" in script.read_text()
    assert str(script) in (Path(env["HOME"]) / ".bashrc").read_text()
