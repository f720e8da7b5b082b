"""A resident agent asks each tmux binary its version once: a deploy's preflight and doctor run no ``tmux -V``
after the first, until the binary is replaced."""

from __future__ import annotations

import os
import shutil

from orchestrator.agent.machine.system import tmux_version


def test_each_tmux_binary_is_asked_once_until_it_changes(tmp_path):
    asked = tmp_path / "asked"
    tmux = tmp_path / "tmux"
    tmux.write_text(f"#!/bin/sh\necho x >> {asked}\necho 'tmux 3.3a'\n")
    tmux.chmod(0o755)
    assert tmux_version(str(tmux)) == tmux_version(str(tmux)) == "tmux 3.3a"
    assert asked.read_text().count("x") == 1
    tmux.write_text(f"#!/bin/sh\necho x >> {asked}\necho 'tmux 3.4'\n")  # an upgrade
    st = tmux.stat()
    os.utime(tmux, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert tmux_version(str(tmux)) == "tmux 3.4"
    assert asked.read_text().count("x") == 2
    real = shutil.which("tmux")
    assert real and tmux_version(real).startswith("tmux ")
    assert tmux_version(str(tmp_path / "gone")) == "?"


def test_a_tmux_too_old_for_orch_is_named_with_the_version_needed(project, tmp_path):
    """A deploy on a machine whose tmux predates ``new-session -e`` (3.2) says which tmux it found and which it
    needs, before anything starts, instead of an agent failure to report (the real CLI on the local target)."""
    real = shutil.which("tmux")
    fake = tmp_path / "oldbin"
    fake.mkdir()
    (fake / "tmux").write_text(f'#!/bin/sh\n[ "$1" = -V ] && {{ echo "tmux 3.1c"; exit 0; }}\nexec {real} "$@"\n')
    (fake / "tmux").chmod(0o755)
    env = {"PATH": f"{fake}:{os.environ['PATH']}", "ORCH_WARM": "0"}
    refused = project.run("deploy", "-m", "old tmux", env=env)
    assert refused.returncode != 0, refused.stdout
    assert "tmux 3.1c on the target is too old: orch needs tmux 3.2 or newer" in refused.stderr, refused.stderr
    assert "hint: install tmux 3.2 or newer there" in refused.stderr and "report it" not in refused.stderr
    assert not (project.root / "runs").exists() or not any((project.root / "runs").iterdir())


def test_a_tmux_that_answers_usage_is_said_to_be_too_old(tmp_path):
    from orchestrator.agent.protocol import AgentFailure
    from orchestrator.agent.run.tmux import Server

    old = tmp_path / "tmux"
    old.write_text('#!/bin/sh\n[ "$1" = -V ] && { echo "tmux 3.0a"; exit 0; }\n'
                   'echo "usage: new-session [-AdDEPX] [-c start-directory] [-F format]" >&2\nexit 1\n')
    old.chmod(0o755)
    try:
        Server("orch-test-old", str(old)).new_session("s", "w", str(tmp_path), "true", {"A": "1"})
    except AgentFailure as exc:
        assert "tmux 3.0a on the target is too old: orch needs tmux 3.2 or newer" in exc.message
    else:
        raise AssertionError("an old tmux's usage line was taken for a session")
