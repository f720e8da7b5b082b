"""Registry ids: made once per registry; rows from before them keep their plain ``runs/<n>`` folders."""

from __future__ import annotations

import sqlite3

from orchestrator.records.experiments import MIGRATIONS, Registry


def test_a_new_registry_keys_every_run(tmp_path):
    with Registry(tmp_path / "a.db") as a, Registry(tmp_path / "b.db") as b:
        assert len(a.registry_id) == 12 and a.registry_id != b.registry_id
        assert a.run_registry(1) == a.registry_id
        assert a.owns({"id": 1, "registry": a.registry_id}) and not a.owns({"id": 1, "registry": b.registry_id})
        assert not a.owns({"id": 1, "registry": None})  # a plain runs/1 is another (older) registry's
        first = a.registry_id
    with Registry(tmp_path / "a.db") as again:
        assert again.registry_id == first  # made once, kept


def test_an_old_registry_reads_its_plain_run_folders(tmp_path):
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    for sql in MIGRATIONS[:2]:  # the schema before registry ids
        db.executescript(sql)
    db.execute("PRAGMA user_version = 2")
    for i in (1, 2, 7):
        db.execute("INSERT INTO experiments (id, project, target, revision, command, created, status) "
                   "VALUES (?, 'p', 'local', 'r', '[]', 0, 'finished')", (i,))
    db.commit()
    db.close()
    with Registry(path) as reg:
        assert reg.run_registry(7) is None and reg.owns({"id": 7, "registry": None})
        assert not reg.owns({"id": 7, "registry": "0123456789ab"})
        new = reg.create(project="p", target="local", revision="r", command=[])
        assert new.id == 8 and reg.run_registry(8) == reg.registry_id
