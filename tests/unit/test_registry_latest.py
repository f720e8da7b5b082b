"""``Registry.latest_by_place``: what ``status --all`` lists, the newest row of each machine (of each target name for
rows from before machines) among the newest rows, with only those rows decoded."""

from __future__ import annotations

import random

from orchestrator.records.experiments import Registry


def _by_hand(reg: Registry, window: int) -> list[int]:
    """The rule as it reads: walk the newest ``window`` rows, newest first, keep the first of each place."""
    latest: dict = {}
    for exp in reg.list(limit=window):
        latest.setdefault(exp.machine or exp.target, exp)
    return [exp.id for _, exp in sorted(latest.items())]


def test_the_newest_row_of_each_machine_or_old_target_name_in_the_window(tmp_path):
    rng = random.Random(7)
    with Registry(tmp_path / "r.db") as reg:
        for _ in range(120):
            machine = rng.choice(["pve1/ct200", "pve1/ct201", "gpu-b", "", None])
            target = rng.choice(["a", "b", "gpu-b"])
            reg.create(project="p", target=target, machine=machine, revision="r", command=["true"],
                       status=rng.choice(["running", "finished", "failed", "stopped"]))
        for window in (1, 5, 37, 500):
            assert [e.id for e in reg.latest_by_place(window)] == _by_hand(reg, window)
        decoded: list[int] = []
        plain = reg._from_row
        reg._from_row = lambda row: decoded.append(row["id"]) or plain(row)  # type: ignore[method-assign]
        shown = reg.latest_by_place(500)
        assert sorted(decoded) == sorted(e.id for e in shown) and len(shown) <= 5  # not the 120 rows


def test_an_empty_registry_lists_nothing(tmp_path):
    with Registry(tmp_path / "r.db") as reg:
        assert reg.latest_by_place() == []
