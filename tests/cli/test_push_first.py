"""A big first push through the real CLI to a local target: the files are hashed while they are sent.

Nothing is cached on the controller (no ``.orch/hashes.json``), so the revision is pending until the push has
hashed it; the revision the target gets must be the one hashing first gives, byte for byte.
"""

from __future__ import annotations

import json
import os

from orchestrator.launch import revisions
from orchestrator.launch.push import BULK

BIG = BULK + (3 << 20)


def _big_tree(project) -> None:
    data = project.path / "data"
    data.mkdir()
    with open(data / "big.bin", "wb") as fh:  # sparse, with a head of its own
        fh.write(os.urandom(4096))
        fh.truncate(BIG)
    for i in range(5):
        (data / f"small{i}.txt").write_bytes(os.urandom(100 + i))
    (data / "copy.txt").write_bytes((data / "small0.txt").read_bytes())  # the same blob under two paths
    text = (project.path / "orch.toml").read_text().replace('sources = ["train.py"]', 'sources = ["train.py", "data"]')
    (project.path / "orch.toml").write_text(text)


def _deploy(project) -> dict:
    res = project.run("deploy", "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_a_first_big_push_is_hashed_while_sent_into_the_revision_hashing_first_gives(project):
    _big_tree(project)
    assert 'sources = ["train.py", "data"]' in (project.path / "orch.toml").read_text()
    first = _deploy(project)
    pushed, rev_id = first["pushed"], first["experiment"]["revision"]
    assert pushed["hashed_while_sent"] == pushed["files"] == 8 and pushed["bytes"] >= BIG
    expected = revisions.build(project.path, ["train.py", "data"])  # hashed first, no cache
    assert rev_id == expected.id
    folder = project.root / "revisions" / rev_id
    for f in expected.files:
        assert (folder / f["path"]).read_bytes() == (project.path / f["path"]).read_bytes()
    cache = json.loads((project.path / ".orch" / "hashes.json").read_text())
    assert {rel: next(iter(v.values())) for rel, v in cache.items()} == {f["path"]: f["sha256"]
                                                                         for f in expected.files}
    assert not [p.name for p in (project.root / "blobs").iterdir() if p.name.startswith(".part")]
    assert project.registry().get(first["experiment"]["id"]).revision == rev_id

    again = _deploy(project)  # the hashes are cached now: nothing to hash or send
    assert again["experiment"]["revision"] == rev_id and again["pushed"]["bytes"] == 0
    assert "hashed_while_sent" not in again["pushed"]


def test_with_the_hash_cache_gone_a_file_the_target_holds_is_hashed_first_and_not_sent_again(project):
    _big_tree(project)
    rev_id = _deploy(project)["experiment"]["revision"]
    (project.path / ".orch" / "hashes.json").unlink()  # a fresh checkout: the target has the blobs already
    (project.path / "data" / "small1.txt").write_bytes(b"changed\n")
    again = _deploy(project)
    assert again["experiment"]["revision"] != rev_id
    assert again["experiment"]["revision"] == revisions.build(project.path, ["train.py", "data"]).id
    assert again["pushed"]["bytes"] < 1 << 20  # the 67 MiB file was not sent a second time
