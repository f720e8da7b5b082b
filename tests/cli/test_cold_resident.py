"""A command that finds no connection keeper (the first of the day, or one after the keeper idled out) sends its
agent calls to one resident agent on its own connection, as the keeper would: its second call does not start the
agent again on the target. Seen from the target: its python is a wrapper that logs every agent process started."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from tests.cli.test_bulk_push import sshd  # noqa: F401  (the fixture)
from tests.loopback_sshd import SSHD

pytestmark = pytest.mark.skipif(shutil.which("ssh") is None or not SSHD.exists(), reason="needs OpenSSH (ssh, sshd)")


def _logged_target(project, sshd, tmp_path: Path) -> Path:
    """Target ``box`` on the loopback sshd, its python a wrapper that logs each agent process; the log's path."""
    log = tmp_path / "agents.log"
    wrapper = tmp_path / "python3"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {shutil.which("python3")} "$@"\n')
    wrapper.chmod(0o755)
    project.configure(extra=f'\n[targets.box]\nkind = "ssh"\nhost = "127.0.0.1"\nport = {sshd.port}\n'
                            f'user = "root"\nroot = "{sshd.state / "root"}"\npython = "{wrapper}"\n\n'
                            f'[ssh]\nknown_hosts = ["{sshd.known_hosts}"]\nidentity_file = "{sshd.key}"\n'
                            'connect_retries = 0\n')
    return log


def _close_keepers() -> None:
    from orchestrator.reach.keeper import client

    client.close(None)


def test_a_deploy_that_finds_no_keeper_starts_the_agent_once_for_all_its_calls(project, sshd, tmp_path):  # noqa: F811
    """The deploy's calls share one agent on its own connection; the keeper it starts, told once the deploy has
    reached the target, opens that connection and readies an agent there: the next commands find both up and
    start no agent of their own."""
    from orchestrator.reach.keeper import client

    log = _logged_target(project, sshd, tmp_path)
    for args in (["deploy", "-t", "box"], ["stop", "-t", "box"]):  # the agent is on the target now
        res = project.run(*args)
        assert res.returncode == 0, res.stderr
    _close_keepers()
    log.unlink()
    (project.path / "train.py").write_text((project.path / "train.py").read_text() + "\n# one line changed\n")

    res = project.run("deploy", "-t", "box")
    assert res.returncode == 0, res.stderr
    deadline = time.monotonic() + 30
    while not (held := [c for k in client.keepers() for c in k["connections"] if c["agents"]]):
        assert time.monotonic() < deadline, client.keepers()
        time.sleep(0.05)
    assert held[0]["alive"] and held[0]["commands"] == 0 and len(held[0]["agents"]) == 1  # readied, not used yet
    started = log.read_text().splitlines()
    # probe, push and start: one agent for the deploy, on its own connection; one the keeper readied
    assert len(started) == 2 and all(line.endswith(".pyz serve") for line in started), started
    with project.registry() as reg:
        assert reg.get(2).status == "running"
    for args in (["stop", "-t", "box"], ["status", "-t", "box"]):
        assert project.run(*args).returncode == 0
    _close_keepers()
    assert len(log.read_text().splitlines()) == 2  # both answered by the readied agent


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

