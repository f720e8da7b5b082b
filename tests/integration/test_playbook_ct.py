"""A project's own deploy playbook on the testbed CTs: its shell step runs before the start, on a single CT and on
every node of a job, in the new run's work folder, and the dry runs list it."""

from __future__ import annotations

import json

import pytest

from tests.integration.test_multinode_ct import _job_project, _log, _until
from tests.integration.test_remote import ROOT, on_ct, remote  # noqa: F401  (the fixture)

pytestmark = pytest.mark.testbed

PROBE = "echo \"probe on $(cat /etc/hostname) in $PWD\" > probe.txt; echo probed"
PLAYBOOK = f"""\
name: deploy
steps:
  - step: preflight
  - step: push_revision
  - step: stop_run
  - step: checkpoints
  - step: record
  - step: shell
    name: probe
    argv: [sh, -c, {json.dumps(PROBE)}]
  - step: start_run
  - step: verify_started
"""
LISTED = f"6. probe: run sh -c '{PROBE}' in the run's work folder"


def _project(remote) -> None:  # noqa: F811
    _job_project(remote, "cat probe.txt", 'OMP_NUM_THREADS = "1"', extra='\n[distributed]\nlauncher = "none"\n')
    (remote.path / "playbooks").mkdir()
    (remote.path / "playbooks" / "deploy.yaml").write_text(PLAYBOOK)


def test_a_custom_shell_step_runs_on_every_node_of_a_job_before_its_start(remote, testbed):  # noqa: F811
    _project(remote)
    job = ("--ct", "200", "--ct", "201")
    dry = remote.run("deploy", *job, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"{LISTED} on every node" in dry.stdout, dry.stdout
    steps = json.loads(remote.run("deploy", *job, "--dry-run", "--json").stdout)["steps"]
    assert [s.split(":")[0] for s in steps] == ["1. preflight", "2. push_revision", "3. stop_run", "4. checkpoints",
                                                "5. record", "6. probe", "7. start_run", "8. verify_started"]
    res = remote.run("deploy", *job)
    assert res.returncode == 0, res.stderr
    assert "[0] probed" in res.stdout and "[1] probed" in res.stdout, res.stdout
    data = _until(remote, ("finished", "crashed"), 60)
    assert [(n["state"], n["exit_code"]) for n in data["nodes"]] == [("finished", 0), ("finished", 0)], data
    revision = remote.registry().get(1).revision
    for vmid, node in zip((200, 201), data["nodes"]):
        # the step wrote the file in the node's work folder before the run's command read it there
        assert f"probe on ct{vmid} in {node['run_dir']}/work" in _log(testbed, node).splitlines()
        assert "probe.txt" not in on_ct(testbed, vmid, "ls", "-A", f"{ROOT}/revisions/{revision}").split()
    again = remote.run("deploy", *job, "--json")  # stdout stays JSON: the step's answers are in it
    assert again.returncode == 0, again.stderr
    assert [(s["node"], s["stdout"]) for s in json.loads(again.stdout)["shell"]] == [(0, "probed\n"), (1, "probed\n")]


def test_the_same_step_runs_on_a_single_ct_before_its_start(remote, testbed):  # noqa: F811
    _project(remote)
    dry = remote.run("deploy", "--ct", "200", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert LISTED in dry.stdout and "on every node" not in dry.stdout, dry.stdout
    res = remote.run("deploy", "--ct", "200", "--wait=20")
    assert res.returncode == 0, res.stderr
    assert "probed" in res.stdout
    run_dir = f"{ROOT}/runs/{remote.run_key(1)}"
    assert f"probe on ct200 in {run_dir}/work" in on_ct(testbed, 200, "cat", f"{run_dir}/train.log").splitlines()
    exp = remote.registry().get(1)
    assert exp.status == "finished" and exp.exit_code == 0, exp
