"""A dry run whose target could not be asked shows the plan, says so, and exits 3 (the target's exit code), so a
script never takes an unchecked plan for a checked one."""

from __future__ import annotations

import json
import socket


def closed_port() -> int:
    with socket.socket() as s:  # bound, never listening, closed: nothing answers there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_dry_run_that_could_not_reach_the_target_exits_3(project):
    project.configure(extra=f'\n[targets.gone]\nkind = "ssh"\nhost = "127.0.0.1"\nport = {closed_port()}\n'
                            'user = "root"\n\n[ssh]\nconnect_retries = 0\nconnect_timeout = 3\npersist = 0\n')
    for args in (["deploy", "-t", "gone", "--dry-run"], ["stop", "-t", "gone", "--dry-run"]):
        res = project.run(*args)
        assert res.returncode == 3, (args, res.stdout, res.stderr)
        assert "(dry run: nothing is changed)" in res.stdout and "what is on the target is unknown" in res.stdout
        errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
        assert len(errors) == 1 and "the dry run could not ask gone" in errors[0] and "cannot connect" in errors[0]
        assert "hint:" in res.stderr and "Traceback" not in res.stderr
    res = project.run("deploy", "-t", "gone", "--dry-run", "--json")
    assert res.returncode == 3
    plan = json.loads(res.stdout)  # stdout is still only the JSON plan
    assert plan["target_state"] is None and "cannot connect" in plan["unreachable"]
    assert project.registry().list() == []
    local = project.run("deploy", "--dry-run")  # a target that answers: the plan, checked, exit 0
    assert local.returncode == 0 and "would stop: nothing" in local.stdout, local.stderr


def test_a_dry_run_whose_ct_could_not_be_looked_up_exits_3(project, monkeypatch):
    monkeypatch.setenv("ORCH_PROXMOX_TOKEN", "11111111-2222-3333-4444-555555555555")
    project.configure(extra=f'\n[proxmox]\nhost = "127.0.0.1"\nport = {closed_port()}\ntoken_id = "root@pam!orch"\n'
                            'verify_ssl = false\ntimeout = 3\n')
    res = project.run("deploy", "--ct", "200", "--dry-run")
    assert res.returncode == 3, (res.stdout, res.stderr)
    assert "plan for deploy on CT 200" in res.stdout
    assert "error: the dry run could not ask CT 200: cannot connect to the Proxmox API" in res.stderr


def test_a_job_dry_run_with_a_node_that_could_not_be_asked_exits_3(project):
    project.configure(extra=f'\n[targets.gone]\nkind = "ssh"\nhost = "127.0.0.1"\nport = {closed_port()}\n'
                            'user = "root"\n\n[ssh]\nconnect_retries = 0\nconnect_timeout = 3\npersist = 0\n')
    res = project.run("deploy", "-t", "local", "-t", "gone", "--dry-run")
    assert res.returncode == 3, (res.stdout, res.stderr)
    assert "plan for deploy on 2 nodes" in res.stdout and "node 1 (gone" in res.stdout
    assert "error: the dry run could not ask 2 nodes" in res.stderr and "node 1 (gone" in res.stderr
