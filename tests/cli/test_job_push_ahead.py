"""A job's nodes take the blobs of a changed file in their probe: storing a blob changes nothing a run or a record
sees, so it may come before the gang check, and a one-line change then needs no push call of its own on any node
(the single target's deploy takes it in its locked call instead). Two local targets with roots of their own stand
for the nodes, each asked by the real agent."""

from __future__ import annotations

from dataclasses import replace

from orchestrator.config import load_settings
from orchestrator.launch import multinode, prepare
from orchestrator.reach.targets import resolve_target


def nodes_of(project, tmp_path):
    settings = load_settings(project.path / "orch.toml")
    local = resolve_target(settings, "local")
    other = replace(local, name="other", root=str(tmp_path / "other"), checkpoints=str(tmp_path / "other-ck"))
    launch = prepare.deploy(settings, local, message=None, clean=False, purge=False, yes=True, confirm=None,
                            echo=lambda _m: None, secret={})
    return launch, multinode.prepare_nodes(launch, multinode.Group("pair", [local, other]))


def probe_and_push(nodes) -> list[tuple[dict, int]]:
    """Each node's probe and push as a job's deploy runs them: what was left missing, and the calls they took."""
    out = []
    for node in nodes:
        multinode._probe_node(node, None)
        multinode._push_node(node)
        out.append((node.probe["missing"], node.client.calls))
        node.close()
    return out


def test_a_changed_file_rides_in_each_nodes_probe_and_no_push_call_follows(project, tmp_path):
    launch, nodes = nodes_of(project, tmp_path)
    first = probe_and_push(nodes)  # the first deploy: every file is new to the hash cache, stored ahead too
    assert launch.revision.fresh == frozenset(f["path"] for f in launch.revision.files)
    assert [m["missing"] for m, _calls in first] == [[], []]

    _launch, nodes = nodes_of(project, tmp_path)  # nothing changed: nothing is sent ahead
    assert _launch.revision.fresh == frozenset()
    assert [(m["missing"], calls) for m, calls in probe_and_push(nodes)] == [([], 1), ([], 1)]

    train = project.path / "train.py"
    train.write_text(train.read_text() + "\n# one line more\n")
    launch, nodes = nodes_of(project, tmp_path)
    changed = next(f["sha256"] for f in launch.revision.files if f["path"] == "train.py")
    assert launch.revision.fresh == frozenset({"train.py"})
    for missing, calls in probe_and_push(nodes):
        assert missing["missing"] == [] and calls == 1  # the probe stored it: no call of its own for the push
    for root in (project.root, tmp_path / "other"):
        assert (root / "blobs" / changed).is_file()


def test_without_the_blobs_ahead_the_push_is_a_call_of_its_own(project, tmp_path, monkeypatch):
    """The plain path, as before: the probe finds the blob missing and the push sends it in a second call."""
    from orchestrator.launch import push

    monkeypatch.setattr(push, "changed_ahead", lambda rev: None)
    _launch, nodes = nodes_of(project, tmp_path)
    probe_and_push(nodes)  # the first deploy (its calls put the agent in place too)
    train = project.path / "train.py"
    train.write_text(train.read_text() + "\n# one line more\n")
    _launch, nodes = nodes_of(project, tmp_path)
    assert all(len(m["missing"]) == 1 and calls == 2 for m, calls in probe_and_push(nodes))
