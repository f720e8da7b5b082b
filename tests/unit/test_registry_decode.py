"""A row read again unchanged is not decoded again; a row changed since (by this command, by another process, or
back by a rolled-back write) is read as it is now."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.errors import ConflictError
from orchestrator.records.experiments import Registry


def _new(reg: Registry):
    return reg.create(project="p", target="local", machine="local:/r", revision="abc", command="python3 train.py",
                      target_info={"kind": "local"}, nodes=[{"rank": 0, "state": "running"}])


def test_an_unchanged_row_is_decoded_once(tmp_path: Path):
    with Registry(tmp_path / "e.db") as reg:
        exp = reg.update(_new(reg).id, status="running")
        assert reg.get(exp.id) is exp is reg.get(exp.id) is reg.latest("local:/r", "local")
        assert reg.list()[0] is reg.get(exp.id)


def test_a_row_changed_by_this_command_or_another_process_is_read_anew(tmp_path: Path):
    with Registry(tmp_path / "e.db") as reg, Registry(tmp_path / "e.db") as other:
        exp = _new(reg)
        first = reg.get(exp.id)
        assert reg.update(exp.id, status="running").status == "running"
        assert reg.get(exp.id).status == "running" and first.status == "launching"
        other.update(exp.id, message="from elsewhere", nodes=[{"rank": 0, "state": "stopped"}])
        seen = reg.get(exp.id)
        assert (seen.message, seen.nodes) == ("from elsewhere", [{"rank": 0, "state": "stopped"}])


def test_a_rolled_back_write_leaves_the_row_as_it_was(tmp_path: Path):
    with Registry(tmp_path / "e.db") as reg:
        exp = _new(reg)
        with pytest.raises(ConflictError):
            with reg.batch():
                assert reg.update(exp.id, status="running", message="not kept").message == "not kept"
                raise ConflictError("the launch failed")
        again = reg.get(exp.id)
        assert (again.status, again.message) == ("launching", None)


def test_a_search_of_the_newest_rows_decodes_only_those_it_reaches(tmp_path: Path):
    """How a job's latest row is found (``multinode.job``): newest first, stopping at the first match."""
    from orchestrator.launch import multinode

    with Registry(tmp_path / "e.db") as reg:
        def row(nodes=None):
            return reg.create(project="p", target="t", machine="ssh:a", revision="abc", command="python3 train.py",
                              target_info={"kind": "ssh"}, nodes=nodes)

        two = [{"rank": 0, "machine": "ssh:a"}, {"rank": 1, "machine": "ssh:b"}]
        job = row(two)
        for _ in range(30):  # single-node runs on node 0's machine, between the two jobs
            row()
        last = row()
        newest = row(two)
        reg._decoded.clear()
        group = multinode.Group(name="a+b", members=[SimpleNamespace(machine=m) for m in ("ssh:a", "ssh:b")])
        assert multinode.job(reg, group).id == newest.id
        assert set(reg._decoded) == {newest.id}  # the 31 older rows were never decoded
        assert [e.id for e in reg.newest(machine="ssh:a", limit=3)] == [newest.id, last.id, last.id - 1]
        assert [e.id for e in reg.list(machine="ssh:a")][-1] == job.id
