"""The agent's tmux, asked through its command line: a real tmux server on a socket of the test's own."""

from __future__ import annotations

import os
import subprocess
import time
import uuid

import pytest

from orchestrator.agent.run import tmux


@pytest.fixture
def server():
    server = tmux.Server(f"orch-test-{uuid.uuid4().hex[:8]}")
    yield server
    subprocess.run(["tmux", f"-L{server.socket_name}", "kill-server"], capture_output=True)


def _windows(server, session: str) -> list[str]:
    return server.cmd("list-windows", "-t", f"={session}", "-F", "#{window_name} #{pane_current_path}").stdout


def _wait_for(path, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().endswith("\n"):
            return path.read_text()
        time.sleep(0.02)
    raise AssertionError(f"{path} was never written")


def test_a_session_and_a_window_beside_it_run_their_commands_where_and_with_what_they_were_given(server, tmp_path):
    assert not server.has_session("orch-proj")
    work = tmp_path / "work"
    work.mkdir()
    out = tmp_path / "first.txt"
    server.new_session("orch-proj", "exp1", str(work), f"sh -c 'pwd > {out}; echo \"$MARK\" >> {out}; sleep 60'",
                       {"MARK": "a b;c"})
    assert server.has_session("orch-proj")
    assert _wait_for(out).split("\n")[:2] == [str(work), "a b;c"]  # the value as given, never parsed by a shell
    assert server.cmd("show-environment", "-t", "=orch-proj", "MARK").stdout == ["MARK=a b;c"]

    beside = tmp_path / "beside.txt"
    assert server.new_window("orch-proj", "exp2", str(tmp_path), f"sh -c 'pwd > {beside}; sleep 60'") is True
    assert _wait_for(beside).strip() == str(tmp_path)
    assert [w.split()[0] for w in _windows(server, "orch-proj")] == ["exp1", "exp2"]


def test_a_name_is_matched_exactly_and_a_window_in_a_session_that_is_gone_says_so(server, tmp_path):
    server.new_session("orch-proj-b", "exp1", str(tmp_path), "sleep 60")
    assert not server.has_session("orch-proj")  # tmux alone would take the prefix for orch-proj-b
    assert server.new_window("orch-proj", "exp2", str(tmp_path), "sleep 60") is False
    assert [w.split()[0] for w in _windows(server, "orch-proj-b")] == ["exp1"]


def test_a_session_tmux_refuses_raises_with_tmux_s_words(server, tmp_path):
    server.new_session("orch-proj", "exp1", str(tmp_path), "sleep 60")
    with pytest.raises(tmux.TmuxError, match="duplicate session"):
        server.new_session("orch-proj", "exp2", str(tmp_path), "sleep 60")
    with pytest.raises(tmux.TmuxError, match="not installed"):
        _missing(server).cmd("ls")


def _missing(server) -> tmux.Server:
    missing = tmux.Server(server.socket_name)
    missing.tmux_bin = None
    return missing


def test_a_command_from_inside_another_tmux_pane_goes_to_its_own_server(server, tmp_path, monkeypatch):
    """An agent started in a tmux pane (a supervisor, a rollback) has TMUX set: its commands still go to the
    server it names, and the session it makes does not inherit that pane's TMUX."""
    monkeypatch.setenv("TMUX", "/tmp/elsewhere,1,0")
    server.new_session("orch-proj", "exp1", str(tmp_path), "sleep 60")
    assert server.has_session("orch-proj")
    shown = server.cmd("show-environment", "-g", "TMUX")
    assert shown.stdout in ([], ["-TMUX"]) and "TMUX=/tmp/elsewhere,1,0" not in shown.stdout
    server.later("new-session", "-d", "-s", "orch~later", "sleep 60")
    deadline = time.monotonic() + 10
    while not server.has_session("orch~later") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.has_session("orch~later")
    assert os.environ["TMUX"] == "/tmp/elsewhere,1,0"  # this process's own environment is left as it was


def test_a_session_made_as_the_last_one_is_killed_is_made_on_a_new_server(server, tmp_path):
    """A stop kills its project's session, the last on its server, and the next queued run of another project
    starts at once: tmux's server is exiting then and answers "server exited unexpectedly" to a new-session."""
    for i in range(60):
        server.new_session("orch-a", "exp1", str(tmp_path), "sleep 60")
        server.cmd("kill-session", "-t", "=orch-a")
        server.new_session("orch-b", f"exp{i}", str(tmp_path), "sleep 60")  # raised TmuxError now and then
        assert server.has_session("orch-b")
        server.cmd("kill-session", "-t", "=orch-b")


def test_a_server_exiting_under_new_session_is_asked_again_and_other_refusals_are_not(tmp_path):
    tries = tmp_path / "tries"
    fake = tmp_path / "tmux"
    fake.write_text("#!/bin/sh\necho x >> " + str(tries) + "\n"
                    "[ $(wc -l < " + str(tries) + ") -lt 3 ] && { echo 'server exited unexpectedly' >&2; exit 1; }\n"
                    "exit 0\n")
    fake.chmod(0o755)
    tmux.Server("orch-fake", tmux_bin=str(fake)).new_session("orch-a", "exp1", str(tmp_path), "true")
    assert tries.read_text().count("x") == 3
    fake.write_text("#!/bin/sh\necho x >> " + str(tries) + "\necho 'duplicate session: orch-a' >&2\nexit 1\n")
    tries.write_text("")
    with pytest.raises(tmux.TmuxError, match="duplicate session"):
        tmux.Server("orch-fake", tmux_bin=str(fake)).new_session("orch-a", "exp1", str(tmp_path), "true")
    assert tries.read_text().count("x") == 1
