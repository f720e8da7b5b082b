"""``Registry.latest_by_place``: what ``status --all`` lists, the newest row of each machine (of each target name for
rows from before machines) among the newest rows, with only those rows decoded."""

from __future__ import annotations

import random

from orchestrator.records.experiments import Registry, _on_machine


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


def test_a_machines_lookups_answer_as_the_plain_queries_do(tmp_path):
    """``latest``, ``unsettled`` and ``orphans`` (read from an index of machine and state) against the same
    questions asked plainly of every row, on a registry with rows from before machines (no machine, named by
    target), several machines, projects and states."""
    rng = random.Random(11)
    states = ["launching", "queued", "running", "lost", "finished", "crashed", "stopped", "failed"]
    with Registry(tmp_path / "r.db") as reg:
        for _ in range(300):
            reg.create(project=rng.choice(["p", "q"]), target=rng.choice(["a", "b"]),
                       machine=rng.choice(["pve1/ct200", "gpu-b", None]), revision="r", command=["true"],
                       status=rng.choice(states))
        where = "(machine = ? OR (machine IS NULL AND target = ?))"
        for machine, target in (("pve1/ct200", "a"), ("gpu-b", "b"), ("gpu-b", "a"), ("nowhere", "b")):
            plain = reg.db.execute(f"SELECT id FROM experiments WHERE {where} AND status NOT IN ('failed', "
                                   "'launching', 'queued') ORDER BY status = 'running' DESC, id DESC LIMIT 1",
                                   (machine, target)).fetchone()
            got = reg.latest(machine, target)
            assert (got.id if got else None) == (plain[0] if plain else None)
            for project in ("p", "q"):
                plain_ids = [r[0] for r in reg.db.execute(
                    f"SELECT id FROM experiments WHERE {where} AND project = ? AND status IN ('launching', 'queued', "
                    "'running', 'lost') ORDER BY id", (machine, target, project))]
                assert [e.id for e in reg.unsettled(machine, target, project)] == plain_ids
                launching = [r[0] for r in reg.db.execute(
                    f"SELECT id FROM experiments WHERE {where} AND project = ? AND status = 'launching' ORDER BY id",
                    (machine, target, project))]
                assert [e.id for e in reg.orphans(machine, target, project)] == launching  # no launcher alive
        for op, states in (("=", ["running"]), ("IN", ["queued", "lost"]), ("NOT IN", ["failed", "queued"])):
            plan = " ".join(str(tuple(r)) for r in reg.db.execute(
                f"EXPLAIN QUERY PLAN {_on_machine(op, len(states))}", ("m", "t", *states)))
            assert plan.count("experiments_machine_status") == 2, plan  # never a walk over every row of a name


def test_places_are_a_projects_rows_newest_first_as_the_rows_say(tmp_path):
    with Registry(tmp_path / "r.db") as reg:
        for i in range(12):
            reg.create(project="p" if i % 3 else "q", target=f"t{i % 2}", machine=None if i % 4 == 0 else f"m{i}",
                       revision="r", command=["true"], status="finished")
        want = [(e.id, e.machine, e.target) for e in reg.list() if e.project == "p"]
        assert reg.places("p") == want and [i for i, *_ in want] == sorted((i for i, *_ in want), reverse=True)
        assert reg.places("nobody") == []


def test_env_users_are_the_experiments_of_each_environment_on_the_machine(tmp_path):
    with Registry(tmp_path / "r.db") as reg:
        for i in range(10):
            reg.create(project="p", target="t", machine="m" if i % 5 else "other", revision="r", command=["true"],
                       status="finished", env={"hash": f"h{i % 2}", "spec": {}} if i % 3 else None)
        want: dict = {}
        for e in sorted(reg.list(machine="m"), key=lambda e: e.id):
            if e.env and e.env.get("hash"):
                want.setdefault(e.env["hash"], []).append(e.id)
        assert reg.env_users("m") == want and set(want) == {"h0", "h1"}
        assert reg.env_users("nowhere") == {}
