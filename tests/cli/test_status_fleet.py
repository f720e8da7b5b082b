"""`orch status` over several SSH targets (real sshds on loopback, the real connection keeper): one agent call per
target brings its rows up to date and reads what is new in its log, and what every target said is recorded."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from tests.conftest import hold_registry, tmux_socket, wait_for
from tests.loopback_sshd import SSHD, LoopbackSshd

pytestmark = pytest.mark.skipif(not SSHD.exists() or not shutil.which("ssh"), reason="needs OpenSSH (ssh, sshd)")

TRAIN = ("import time\nfor i in range(100000):\n    print(f'step={i} loss={1 / (i + 1)}', flush=True)\n"
         "    time.sleep(0.1)\n")
HOSTS = 3


@pytest.fixture
def fleet(project, tmp_path: Path):
    """``HOSTS`` sshds, each a target ``hN`` of the project with its own root, a running run on each."""
    import subprocess
    from contextlib import ExitStack

    with ExitStack() as stack:
        hosts = [stack.enter_context(LoopbackSshd(tmp_path / f"sshd{n}")) for n in range(HOSTS)]
        for h in hosts[1:]:
            (h.state / "authorized_keys").write_text((hosts[0].state / "known.pub").read_text())
        known = tmp_path / "known_hosts"
        known.write_text("".join(h.host_key_line() for h in hosts))
        roots = [tmp_path / f"root{n}" for n in range(HOSTS)]
        targets = "".join(f'\n[targets.h{n}]\nkind = "ssh"\nhost = "127.0.0.1"\nport = {h.port}\nuser = "root"\n'
                          f'root = "{roots[n]}"\ncheckpoints = "{roots[n]}/ckpt"\n' for n, h in enumerate(hosts))
        project.configure(extra=f'\n[ssh]\nknown_hosts = ["{known}"]\nidentity_file = "{hosts[0].key}"\n' + targets)
        (project.path / "train.py").write_text(TRAIN)
        try:
            for n in range(HOSTS):
                res = project.run("deploy", "--target", f"h{n}")
                assert res.returncode == 0, res.stdout + res.stderr
            yield hosts
        finally:
            for root in roots:
                subprocess.run(["tmux", "-L", tmux_socket(str(root)), "kill-server"], capture_output=True)


def held_commands(project) -> dict[str, int]:
    """The commands each connection the keeper holds has carried, by target (user@host:port)."""
    res = project.run("connections", "list", "--json")
    assert res.returncode == 0, res.stderr
    return {c["target"]: c["commands"] for k in json.loads(res.stdout)["keepers"] for c in k["connections"]}


def every_connection_held(project) -> None:
    """Once ``status --all`` has gone through the keeper, it holds a connection to every target."""
    assert project.run("status", "--all").returncode == 0
    wait_for(lambda: len(held_commands(project)) == HOSTS, timeout=60, what="the keeper holding every connection")


def test_status_all_asks_each_target_once_and_records_what_each_said(project, fleet):
    every_connection_held(project)
    with project.registry() as reg:
        before = {e.id: (reg.metrics(e.id) or {}).get("log_offset", 0) for e in reg.list()}
    time.sleep(0.5)  # every run's log grows
    counted = held_commands(project)
    res = project.run("status", "--all", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    after = held_commands(project)
    assert {t: after[t] - counted[t] for t in counted} == {t: 1 for t in counted}  # state and log in one call
    rows = json.loads(res.stdout)
    assert sorted(r["target"] for r in rows) == [f"h{n}" for n in range(HOSTS)]
    for row in rows:
        assert row["state"] == "running" and row["summary"]["step"] >= 1 and row["last_line"].startswith("step=")
    with project.registry() as reg:
        for row in rows:
            stored = reg.metrics(row["experiment"])
            assert stored["log_offset"] > before[row["experiment"]]  # what was read is recorded
            assert stored["summary"]["step"] == row["summary"]["step"]


def test_status_of_one_target_asks_it_once(project, fleet):
    every_connection_held(project)
    counted = held_commands(project)
    res = project.run("status", "--target", "h1")
    assert res.returncode == 0 and "h1 (127.0.0.1): experiment 2 running" in res.stdout, res.stdout + res.stderr
    assert "step=" in res.stdout
    after = held_commands(project)
    assert sorted(after[t] - counted[t] for t in counted) == [0, 0, 1]


def test_a_run_ended_between_two_statuses_is_recorded_as_every_target_reports_it(project, fleet):
    res = project.run("stop", "--target", "h2")
    assert res.returncode == 0, res.stdout + res.stderr
    with project.registry() as reg:  # as if the stop had not been recorded: status --all settles it
        reg.update(3, status="running", exit_code=None, ended=None, end_reason=None)
    res = project.run("status", "--all", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    rows = {r["target"]: r for r in json.loads(res.stdout)}
    assert rows["h2"]["state"] == "stopped" and rows["h0"]["state"] == rows["h1"]["state"] == "running"
    with project.registry() as reg:
        assert reg.get(3).status == "stopped" and reg.get(3).ended is not None
        assert reg.get(1).status == "running"


def test_a_finished_run_whose_folder_is_gone_keeps_its_record_and_says_so(project):
    project.configure(steps=3)
    assert project.run("deploy", "--wait").returncode == 0
    assert "experiment 1 finished" in project.run("status").stdout
    shutil.rmtree(project.run_dir(1))  # collected since
    res = project.run("status")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "experiment 1 finished (exit code 0)" in res.stdout
    assert "! experiment 1 has no run folder on target local" in res.stdout
    with project.registry() as reg:
        assert reg.get(1).status == "finished" and reg.metrics(1)["summary"]["_state"]["no_run_folder"]


def test_status_with_the_registry_held_past_the_wait_shows_what_the_target_said_and_records_nothing(project):
    project.configure(steps=3)
    assert project.run("deploy", "--wait").returncode == 0
    db = project.path / ".orch" / "experiments.db"
    holder = hold_registry(db)
    try:
        res = project.run("status", env={"ORCH_RUN__REGISTRY_TIMEOUT": "4"})  # held past that wait
    finally:
        holder.kill()
        holder.wait()
    assert res.returncode == 0, res.stderr
    assert "local: experiment 1" in res.stdout and "step=3/3" in res.stdout  # what the target said, shown
    assert res.stderr.count(f"is locked by another process (pid {holder.pid}") == 1  # waited for once, not per write
    assert "not recorded" in res.stderr and "the next command records it" in res.stderr
    with project.registry() as reg:
        assert reg.get(1).status == "running" and reg.metrics(1) is None
    assert project.run("status").returncode == 0  # the holder gone: the next command records it
    with project.registry() as reg:
        assert reg.get(1).status == "finished" and reg.metrics(1)["summary"]["_state"]["complete"]
