"""What ``orch ui`` reads from the registry: read-only, never in a command's way, the table's columns by name."""

from __future__ import annotations

import pytest

from orchestrator.errors import NotFoundError, OrchError
from orchestrator.records.experiments import Registry, listing
from tests.conftest import hold_registry


def _fill(db, n: int = 3) -> None:
    with Registry(db) as reg:
        for i in range(n):
            exp = reg.create(project="p", target="local", machine="local:/r", revision=f"rev{i}", command="python3 t.py",
                             batching={"strategy": ("megabatch", "shuffle")[i % 2]}, status="finished",
                             message=f"run {i}", gpus=[{"index": i, "uuid": f"GPU-{i}"}] if i else None,
                             target_info={"ct": 300 + i} if i == 2 else {})
            summary = {"loss": 2.0 - i / 10, "median_tok_s": 1000.0 + i, "_state": {"complete": True}}
            if i == 1:
                summary["val_loss"] = 2.5
            reg.save_metrics(exp.id, 10, {}, summary)


def test_a_reader_makes_no_registry_and_says_none_is_there(tmp_path):
    db = tmp_path / ".orch" / "experiments.db"
    with pytest.raises(NotFoundError):
        Registry(db, read_only=True)
    assert not db.parent.exists()


def test_a_reader_reads_while_a_command_holds_the_write_lock_and_never_writes(tmp_path):
    db = tmp_path / "experiments.db"
    _fill(db)
    holder = hold_registry(db)
    try:
        with Registry(db, read_only=True) as reader:
            assert [e.id for e in reader.list()] == [3, 2, 1]
            with pytest.raises(OrchError, match="read-only"):
                reader.update(1, message="changed")
            with pytest.raises(OrchError, match="read-only"):
                reader.save_metrics(1, 0, {}, {})
    finally:
        holder.kill()
        holder.wait()
    with Registry(db, read_only=True) as reader, Registry(db, lock_wait=2) as writer:
        reader.list()  # a reader open beside a writer does not hold it up
        writer.update(1, message="renamed")
        assert reader.get(1).message == "renamed"  # each read is its own transaction: it sees the commit


def test_a_table_page_has_the_columns_of_each_row_filtered_sorted_and_cut_in_the_registry(tmp_path):
    from orchestrator.records.table import page

    db = tmp_path / "experiments.db"
    _fill(db)
    with Registry(db, read_only=True) as reg:
        got = page(reg, limit=10)
        listed = listing(reg, reg.list())
        rows = got["rows"]
        assert got["total"] == 3 and [r["id"] for r in rows] == [e["id"] for e in listed] == [3, 2, 1]
        for row, exp in zip(rows, listed):
            assert (row["state"], row["message"], row["target"], row["strategy"]) == \
                (exp["status"], exp["message"], exp["target"], exp["batching"]["strategy"])
            assert row["gpus"] == [g["index"] for g in exp["gpus"] or []]
        assert rows[0]["ct"] == 302 and rows[1]["ct"] is None
        assert rows[1]["values"] == {"best:loss": None, "last:loss": 1.9, "best:eval_loss": None,
                                     "last:eval_loss": 2.5}
        # sorted on a metric, the rows without one last either way; a filter's value is a part, in any case
        assert [r["id"] for r in page(reg, sort="last:loss", desc=False)["rows"]] == [3, 2, 1]
        assert [r["id"] for r in page(reg, sort="last:eval_loss", desc=True)["rows"]] == [2, 3, 1]
        assert [r["id"] for r in page(reg, filters={"message": "RUN 1"})["rows"]] == [2]
        assert [r["id"] for r in page(reg, filters={"target": "302"})["rows"]] == [3]
        assert page(reg, filters={"message": "run", "state": "finished"}, offset=2, limit=5)["rows"][0]["id"] == 1
        assert len(page(reg, limit=2)["rows"]) == 2
        with pytest.raises(ValueError, match="no column 'loss; DROP'"):
            page(reg, sort="loss; DROP")


def test_the_table_shows_throughput_with_its_unit_and_an_eval_loss_by_its_name(tmp_path):
    from orchestrator.config import load_settings
    from orchestrator.ui import api

    (tmp_path / "orch.toml").write_text('[project]\nname = "p"\n')
    settings = load_settings(tmp_path / "orch.toml")
    _fill(settings.state_dir / "experiments.db")
    rows = {r["id"]: r for r in api.table(settings)["rows"]}
    assert rows[2]["values"]["last:eval_loss"] == 2.5 and rows[1]["values"]["last:eval_loss"] is None
    assert rows[1]["throughput"] == {"value": 1000.0, "unit": "tok/s"}
    assert rows[3]["gpus"] == [2] and rows[3]["strategy"] == "megabatch" and rows[3]["ct"] == 302
    assert api.experiments(settings, limit=2) == _listed(settings, 2)  # orch experiments list --json's rows


def _listed(settings, limit: int) -> list[dict]:
    with Registry(settings.state_dir / "experiments.db") as reg:
        return listing(reg, reg.list(limit=limit))


def test_the_table_is_read_again_once_the_registry_changes(tmp_path):
    from orchestrator.config import load_settings
    from orchestrator.ui import api

    (tmp_path / "orch.toml").write_text('[project]\nname = "p"\n')
    settings = load_settings(tmp_path / "orch.toml")
    _fill(settings.state_dir / "experiments.db")
    assert api.table(settings)["rows"][0]["message"] == "run 2"
    assert api.table(settings)["rows"][0]["message"] == "run 2"  # unchanged: the same rows
    with Registry(settings.state_dir / "experiments.db") as reg:
        reg.update(3, message="renamed")
        reg.create(project="p", target="local", revision="r", command="c", status="launching")
    rows = api.table(settings)["rows"]
    assert [r["id"] for r in rows[:2]] == [4, 3] and rows[1]["message"] == "renamed"
    assert rows[0]["state"] == "orphaned"  # a launch whose orch is gone (none was ever there)
