"""A command that finds no connection keeper (the first of the day, or one after the keeper idled out) starts the
agent on the target once for all its calls: in an orch process of its own, through a keeper it starts at once (as
it begins, told the target once it knows it); in a warm process's child, on a resident agent on its own connection,
as the keeper would. Seen from the target: its python is a wrapper that logs every agent process started."""

from __future__ import annotations

import json

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli.test_bulk_push import sshd  # noqa: F401  (the fixture)
from tests.loopback_sshd import SSHD

pytestmark = pytest.mark.skipif(shutil.which("ssh") is None or not SSHD.exists(), reason="needs OpenSSH (ssh, sshd)")


LONG_RUN = "import time\nprint('step=1 loss=2.5', flush=True)\ntime.sleep(600)\n"


def _logged_target(project, sshd, tmp_path: Path) -> Path:
    """Target ``box`` on the loopback sshd, its python a wrapper that logs each agent process; the log's path. The
    project's run goes on until it is stopped (a short one could end before a test's ``stop``)."""
    (project.path / "train.py").write_text(LONG_RUN)
    log = tmp_path / "agents.log"
    wrapper = tmp_path / "python3"
    wrapper.write_text(f'#!/bin/sh\necho "$SSH_CONNECTION $*" >> {log}\nexec {shutil.which("python3")} "$@"\n')
    wrapper.chmod(0o755)
    project.configure(extra=f'\n[targets.box]\nkind = "ssh"\nhost = "127.0.0.1"\nport = {sshd.port}\n'
                            f'user = "root"\nroot = "{sshd.state / "root"}"\npython = "{wrapper}"\n\n'
                            f'[ssh]\nknown_hosts = ["{sshd.known_hosts}"]\nidentity_file = "{sshd.key}"\n'
                            'connect_retries = 0\n')
    return log


def _close_keepers() -> None:
    from orchestrator.reach.keeper import client

    client.close(None)


def test_a_deploy_that_finds_no_keeper_starts_one_at_once_whose_connection_and_agent_serve_all_its_calls(
        project, sshd, tmp_path):  # noqa: F811
    """In an orch process of its own (no warm process), a deploy that finds no keeper starts one as soon as it knows
    its target, told to log in and ready an agent there while the deploy goes on loading and preparing; the
    deploy's calls go through it, and so do the next commands': one login and one agent start for all of them."""
    from orchestrator.reach.keeper import client

    log = _logged_target(project, sshd, tmp_path)
    for args in (["deploy", "-t", "box"], ["stop", "-t", "box"]):  # the agent is on the target now
        res = project.run(*args)
        assert res.returncode == 0, res.stderr
    _close_keepers()
    log.unlink()
    (project.path / "train.py").write_text((project.path / "train.py").read_text() + "\n# one line changed\n")

    res = project.run("deploy", "-t", "box", "--json")
    assert res.returncode == 0, res.stderr
    # the login the keeper made for it is the deploy's, whether the readying or its first request opened it
    assert json.loads(res.stdout)["stats"]["connections"] == 1, res.stdout
    (held,) = [c for k in client.keepers() for c in k["connections"]]  # up already: the deploy's calls used it
    assert held["alive"] and held["connections"] == 1 and held["commands"] >= 2 and len(held["agents"]) == 1
    started = log.read_text().splitlines()
    assert len(started) == 1 and started[0].endswith(".pyz serve"), started  # probe, push and start: one agent
    with project.registry() as reg:
        assert reg.get(2).status == "running"
    for args in (["stop", "-t", "box"], ["status", "-t", "box"]):
        assert project.run(*args).returncode == 0
    _close_keepers()
    assert log.read_text().splitlines() == started  # answered by the same agent, on the same login


def test_a_first_command_whose_target_refuses_its_login_says_so_as_before(project, sshd, tmp_path):  # noqa: F811
    """The keeper that the first command starts at once meets the refusal (an unknown host key here); the
    command reports it as its own connection would have, and nothing is held."""
    from orchestrator.reach.keeper import client

    _logged_target(project, sshd, tmp_path)
    sshd.known_hosts.write_text("")  # strict host keys: this host is not known
    res = project.run("status", "-t", "box")
    assert res.returncode != 0 and "error:" in res.stderr and "hint:" in res.stderr, res.stderr
    assert "host key" in res.stderr.lower(), res.stderr
    assert not [c for k in client.keepers() for c in k["connections"] if c["alive"]]
    _close_keepers()


def test_a_resident_that_cannot_start_leaves_the_call_to_a_one_shot_agent(project, sshd, tmp_path):  # noqa: F811
    """The first deploy to a target: no agent there yet. The resident's start fails, the one-shot call says the
    file is missing, the agent is pushed, and the calls go on on a resident."""
    log = _logged_target(project, sshd, tmp_path)
    res = project.run("deploy", "-t", "box")
    assert res.returncode == 0, res.stderr
    time.sleep(1)  # the keeper's readied agent, when it comes
    started = [line.rsplit("/", 1)[-1] for line in log.read_text().splitlines()]
    name = started[-1].split()[0]
    # the command's resident (refused: no file), its one-shot call (pushes the agent), its resident again; the
    # keeper it started readies one more at any point among them (refused too, when it comes before the push)
    mine = [f"{name} serve", name, f"{name} serve"]
    readied = [started[:i] + started[i + 1:] for i, line in enumerate(started) if line == f"{name} serve"]
    assert started == mine or (len(started) == 4 and mine in readied), started
    assert (sshd.state / "root" / "agent" / name).is_file()
    assert project.run("stop", "-t", "box").returncode == 0



def _orch(project, *args: str) -> "subprocess.CompletedProcess":
    """The ``orch`` script as a user runs it: through this user's warm orch process once one is up."""
    import subprocess
    import sys

    return subprocess.run([str(Path(sys.executable).parent / "orch"), *args], cwd=project.path, capture_output=True,
                          text=True, timeout=120)


def _warm_up(project) -> None:
    from orchestrator.warm import client as warm_client

    assert _orch(project, "experiments", "list").returncode == 0  # starts the warm process for the next commands
    deadline = time.monotonic() + 30
    while not warm_client.processes():
        assert time.monotonic() < deadline, "no warm orch process came up"
        time.sleep(0.05)


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def test_a_warm_deploy_that_finds_no_keeper_becomes_the_keeper_with_its_connection_and_agent(project, sshd,
                                                                                              tmp_path):  # noqa: F811
    """After a break (no keeper) a deploy run by the warm process logs in once and starts one agent; once its answer
    is out it holds that connection and that agent as the keeper, so the commands after it log in no more and start
    no agent: none of them waits for a keeper still connecting."""
    from orchestrator.reach.keeper import client

    log = _logged_target(project, sshd, tmp_path)
    _warm_up(project)
    for args in (["deploy", "-t", "box"], ["stop", "-t", "box"]):  # the agent is on the target now
        res = _orch(project, *args)
        assert res.returncode == 0, res.stderr
    _close_keepers()
    log.unlink()
    (project.path / "train.py").write_text((project.path / "train.py").read_text() + "\n# one line changed\n")

    res = _orch(project, "deploy", "-t", "box")
    assert res.returncode == 0, res.stderr
    deadline = time.monotonic() + 30
    while not (found := client.keepers()):
        assert time.monotonic() < deadline, "the deploy did not become the keeper"
        time.sleep(0.05)
    (keeper,) = found
    assert "orchestrator.reach.keeper" not in _cmdline(keeper["pid"])  # no keeper process was started
    assert "orchestrator.warm.server" in _cmdline(keeper["pid"])  # the deploy's own process holds it
    (held,) = keeper["connections"]
    assert held["alive"] and held["commands"] == 0 and len(held["agents"]) == 1  # the deploy's, unused since
    for args in (["status", "-t", "box"], ["stop", "-t", "box"], ["logs", "-t", "box", "-n", "5"]):
        res = _orch(project, *args)
        assert res.returncode == 0, (args, res.stderr)
    (keeper_after,) = client.keepers()
    assert keeper_after["pid"] == keeper["pid"] and keeper_after["connections"][0]["commands"] >= 3
    started = log.read_text().splitlines()
    assert len(started) == 1 and started[0].endswith(".pyz serve"), started  # one agent for all of them
    with project.registry() as reg:
        assert reg.get(2).status == "stopped"
    _close_keepers()
    assert not client.keepers()


def test_a_warm_command_that_cannot_reach_its_target_holds_nothing_and_the_next_one_connects(project, sshd,
                                                                                            tmp_path):  # noqa: F811
    """A command that never reached its target hands the keeper nothing: the keeper it becomes holds no connection,
    and the next command, the target back, logs in through it as usual."""
    from orchestrator.reach.keeper import client

    _logged_target(project, sshd, tmp_path)
    good = (project.path / "orch.toml").read_text()
    (project.path / "orch.toml").write_text(good.replace(f"port = {sshd.port}", f"port = {_closed_port()}"))
    _warm_up(project)
    _close_keepers()
    res = _orch(project, "status", "-t", "box")
    assert res.returncode == 3 and "Connection refused" in res.stderr, res.stderr
    time.sleep(0.5)
    assert all(not k["connections"] for k in client.keepers())  # nothing held, whoever keeps
    (project.path / "orch.toml").write_text(good)
    res = _orch(project, "deploy", "-t", "box")
    assert res.returncode == 0, res.stderr
    assert _orch(project, "stop", "-t", "box").returncode == 0
    held = [c for k in client.keepers() for c in k["connections"]]
    assert len(held) == 1 and held[0]["alive"], held


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]



def test_the_keeper_a_warm_command_becomes_listens_before_its_answer(project, sshd, tmp_path):  # noqa: F811
    """The keeper a command becomes takes its socket before that command's answer: a command typed right after it
    (`orch connections close` above all) finds it there, rather than run before it and miss it."""
    from orchestrator.reach.keeper import client, place

    _logged_target(project, sshd, tmp_path)
    _warm_up(project)
    assert _orch(project, "deploy", "-t", "box").returncode == 0
    for _ in range(5):
        _close_keepers()
        assert not place.socket_path().exists()
        res = _orch(project, "status", "-t", "box")
        assert res.returncode == 0, res.stderr
        assert place.socket_path().exists()  # at once, as the command's answer came
        closed = _orch(project, "connections", "close")
        assert closed.returncode == 0, closed.stderr
        assert not client.keepers()
    assert _orch(project, "stop", "-t", "box").returncode == 0


def test_a_warm_follow_that_finds_no_keeper_starts_one_beside_it_and_the_next_commands_use_it(project, sshd,
                                                                                             tmp_path):  # noqa: F811
    """``orch logs --follow`` runs until the run ends, maybe hours: a command typed meanwhile must not wait for its
    end to find a keeper. After a break the follow starts a keeper process at once, readied with the connection and
    agent the follow reached; the ``status`` typed beside it goes through that keeper and starts no agent."""
    import subprocess
    import sys

    from orchestrator.reach.keeper import client

    log = _logged_target(project, sshd, tmp_path)
    _warm_up(project)
    res = _orch(project, "deploy", "-t", "box")
    assert res.returncode == 0, res.stderr
    _close_keepers()
    log.unlink()
    follow = subprocess.Popen([str(Path(sys.executable).parent / "orch"), "logs", "-f", "-t", "box"],
                              cwd=project.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (held := [(k, c) for k in client.keepers() for c in k["connections"] if c["agents"]]):
            assert follow.poll() is None and time.monotonic() < deadline, (follow.poll(), client.keepers())
            time.sleep(0.05)
        (keeper, conn), = held
        assert "orchestrator.reach.keeper" in _cmdline(keeper["pid"])  # its own process, up while the follow runs
        assert conn["alive"]  # readied (the follow's later reads may use it too)
        res = _orch(project, "status", "-t", "box")
        assert res.returncode == 0, res.stderr
        (keeper_after,) = client.keepers()
        assert keeper_after["pid"] == keeper["pid"] and keeper_after["connections"][0]["commands"] > conn["commands"]
        # each agent logs the SSH connection it runs on: the follow's own (the first to reach the target), and the
        # keeper's, where its readied agent and any it started since (for the status, or the follow's later reads)
        # run; no third connection, the status's own
        lines = log.read_text().splitlines()
        ports = [line.split()[1] for line in lines]
        assert set(ports) == {ports[0], str(conn["local_port"])} and len(set(ports)) == 2, lines
        assert all(line.endswith(".pyz serve") for line in lines), lines
        assert follow.poll() is None, follow.communicate()  # still following
        res = _orch(project, "stop", "-t", "box")
        assert res.returncode == 0, res.stderr
        out, err = follow.communicate(timeout=60)
        assert follow.returncode == 0, err
        assert "experiment 1 stopped" in err, err
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()
    time.sleep(0.5)
    assert [k["pid"] for k in client.keepers()] == [keeper["pid"]]  # the follow, ended, became no second one
    _close_keepers()


def _orch_cold(project, *args: str) -> subprocess.CompletedProcess:
    """The ``orch`` script as users run it (``orchestrator.main``), with no warm process to hand the command to."""
    orch = Path(sys.executable).parent / "orch"
    return subprocess.run([str(orch), *args], cwd=project.path, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, ORCH_WARM="0"))


def test_the_orch_command_starts_the_keeper_before_its_imports_and_tells_it_its_target(project, sshd,  # noqa: F811
                                                                                     tmp_path):
    """`orch status` with no keeper up starts one as it begins; told the target once the command knows it, the
    keeper logs in and starts the agent that answers the command: one login, one agent, held for the next ones."""
    from orchestrator.reach.keeper import client

    log = _logged_target(project, sshd, tmp_path)
    assert project.run("deploy", "-t", "box").returncode == 0  # the agent is on the target now
    _close_keepers()
    log.unlink()

    res = _orch_cold(project, "status", "-t", "box")
    assert res.returncode == 0, res.stderr
    (keeper,) = client.keepers()
    (held,) = keeper["connections"]
    assert held["alive"] and held["connections"] == 1 and held["commands"] >= 1 and len(held["agents"]) == 1
    assert len(log.read_text().splitlines()) == 1
    assert _orch_cold(project, "stop", "-t", "box").returncode == 0
    assert len(log.read_text().splitlines()) == 1  # the next command found both up
    _close_keepers()


def test_a_keeper_started_for_a_command_that_reaches_no_remote_target_exits_with_it(project):
    """`orch status` of the local target: the keeper started as the command began is told nothing and exits."""
    from orchestrator.reach.keeper import client

    res = _orch_cold(project, "status")
    assert res.returncode == 0, res.stderr
    deadline = time.monotonic() + 10
    while client.keepers():
        assert time.monotonic() < deadline, client.keepers()
        time.sleep(0.05)
