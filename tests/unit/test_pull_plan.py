"""What orch pull does with each file, from both sides' sizes and hashes (``launch/pull_plan.py``, pure)."""

from __future__ import annotations

from orchestrator.launch.pull_plan import Local, plan, summary, unknown

A, B = "a" * 64, "b" * 64


def _one(remote: dict, local: Local, force: bool = False):
    return plan([remote], {remote["key"]: local}, force=force)[0]


def test_each_state_of_a_file_here_gets_its_action():
    f = {"key": "checkpoints/x.pt", "size": 100, "sha256": A}
    assert _one(f, Local()).action == "new"
    assert _one(f, Local(kind="file", size=100, sha256=A)).action == "same"
    assert _one(f, Local(kind="file", size=100, sha256=B)).action == "conflict"
    assert _one(f, Local(kind="file", size=7)).action == "conflict"  # another size: no hash needed to know
    assert _one(f, Local(kind="other")).action == "conflict"  # a link where the file would go
    assert _one(f, Local(kind="other"), force=True).action == "replace"
    assert _one(f, Local(kind="dir"), force=True).action == "conflict"  # a folder here is never replaced
    assert _one(f, Local(kind="file", size=100, sha256=B), force=True).action == "replace"
    resumed = _one(f, Local(part=40))
    assert (resumed.action, resumed.offset, resumed.sends) == ("resume", 40, 60)


def test_a_part_longer_than_the_file_starts_over_and_same_size_without_a_hash_is_asked():
    f = {"key": "train.log", "size": 10}
    assert _one(f, Local(part=11)).action == "new" and _one(f, Local(part=11)).offset == 0
    items = plan([f], {"train.log": Local(kind="file", size=10, sha256=A)})
    assert unknown(items) == ["train.log"]  # the target's hash decides


def test_the_summary_counts_only_what_is_sent():
    remote = [{"key": "outputs/a", "size": 5, "sha256": A}, {"key": "outputs/b", "size": 9, "sha256": B},
              {"key": "outputs/c", "size": 4, "sha256": A}]
    local = {"outputs/a": Local(kind="file", size=5, sha256=A), "outputs/b": Local(part=3)}
    assert summary(plan(remote, local)) == {"files": 3, "bytes": 6 + 4, "same": 1, "resume": 1, "new": 1}
