"""The agent's envs on a hand-made root: only a linked, complete env counts; gc keeps the ones runs use; the wire
refuses an env call that would name a path."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from orchestrator.agent.serving import validate
from orchestrator.agent.store import envs
from orchestrator.agent.store.gc import gc, plan
from orchestrator.agent.layout import Layout
from orchestrator.agent.protocol import AgentFailure

OLD = time.time() - 7200
A, B, C = "a" * 16, "b" * 16, "c" * 16


def _env(root: Path, env_hash: str, packages: dict, wheels: list | None = None, link: bool = True) -> Path:
    store = root / "envs" / ".store" / f"{env_hash}-x1"
    (store / "venv" / "bin").mkdir(parents=True)
    (store / "venv" / envs.INFO).write_text(json.dumps({"hash": env_hash, "packages": packages,
                                                        "wheels": wheels or [], "built": OLD}))
    if link:
        os.symlink(f".store/{env_hash}-x1/venv", root / "envs" / env_hash)
    return store


def _run(root: Path, exp_id: int, env_hash: str | None) -> None:
    d = root / "runs" / str(exp_id)
    d.mkdir(parents=True)
    (d / "experiment.json").write_text(json.dumps({"id": exp_id, "project": "p", "revision": "0" * 16}))
    env = {"VIRTUAL_ENV": str(root / "envs" / env_hash)} if env_hash else {}
    (d / "launch.json").write_text(json.dumps({"argv": ["true"], "env": env}))
    (d / "exit.json").write_text(json.dumps({"exit_code": 0, "ended": OLD}))


def _age(root: Path) -> None:
    for p in [root, *root.rglob("*")]:
        os.utime(p, (OLD, OLD), follow_symlinks=False)


def test_only_a_linked_complete_env_is_built_and_usable(tmp_path):
    layout = Layout(str(tmp_path))
    layout.ensure()
    _env(tmp_path, A, {"six": "1.16.0"})
    _env(tmp_path, B, {"six": "1.15.0"}, link=False)  # a build that was cut before its link: never used
    assert envs.built(layout) == [A]
    assert envs.use(layout, A)["packages"] == {"six": "1.16.0"}
    with pytest.raises(AgentFailure, match=f"environment {B} is not built"):
        envs.use(layout, B)
    assert envs.probe(layout)["envs"] == {A: {"six": "1.16.0"}}


def test_gc_keeps_used_envs_and_their_wheels_and_removes_the_rest(tmp_path):
    layout = Layout(str(tmp_path))
    layout.ensure()
    sha = "d" * 64
    (tmp_path / "blobs" / sha).write_bytes(b"wheel")
    _env(tmp_path, A, {"six": "1.16.0"}, wheels=[sha])
    _env(tmp_path, B, {"six": "1.15.0"})
    _env(tmp_path, C, {"six": "1.14.0"})
    cut = _env(tmp_path, "e" * 16, {}, link=False)
    _run(tmp_path, 1, A)
    _age(tmp_path)
    got = plan(layout, "p", keep=5, keep_envs=[C])
    gone = {(i["kind"], i["name"]) for i in got["items"]}
    assert ("env", B) in gone and ("stale", f"envs/.store/{cut.name}") in gone
    assert ("env", A) not in gone and ("env", C) not in gone  # a run started in A; the registry keeps C
    assert ("blob", sha) not in gone  # A's wheels stay with it
    kept = {k["name"]: k["why"] for k in got["kept"] if k["kind"] == "env"}
    assert kept[A].startswith("used by experiment 1") and "registry" in kept[C]
    gc(layout, "p", keep=5, keep_envs=[C], dry_run=False)
    assert envs.built(layout) == [A, C]
    assert sorted(p.name for p in (tmp_path / "envs" / ".store").iterdir()) == [f"{A}-x1", f"{C}-x1"]


@pytest.mark.parametrize("args, message", [
    ({"hash": "../../etc"}, "16 lowercase hex"),
    ({"hash": A, "wheels": [{"name": "../x.whl", "sha256": "d" * 64}]}, "plain file name"),
    ({"hash": A, "wheels": [{"name": "x.whl", "sha256": "nope"}]}, "sha256"),
    ({"hash": A, "installer": "conda"}, "one of auto, uv, pip"),
])
def test_the_wire_refuses_an_env_build_that_would_name_a_path(args, message):
    with pytest.raises(AgentFailure, match=message):
        validate.op_args("env_build", {"requirements": "six\n", **args})
