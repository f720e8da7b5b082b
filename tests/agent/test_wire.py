"""Crafted manifests and envelopes against the real agent (the zipapp, as a process), and crafted answers
against the controller: only clean ``input`` errors, never a traceback, nothing written outside the root."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.agent.protocol import MARK_BEGIN, MARK_END, frame, manifest_id, unframe
from orchestrator.agent.serving.validate import ARGS
from orchestrator.reach.agent_client import AgentClient, Op, agent_zip
from orchestrator.errors import AgentError, InputError
from orchestrator.reach.transport.base import Result, Transport
from orchestrator.reach.transport.local import LocalTransport

# each example is one real agent process (~0.1-0.3 s): modest counts keep the suite quick
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
GOOD = [b"print('a')\n", b"#!/bin/sh\necho b\n"]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Wire:
    """A target folder beside a sentinel folder, the real agent zip, and a way to send it raw bytes."""

    def __init__(self, base: Path) -> None:
        self.base, self.root, self.sentinel = base, base / "root", base / "sentinel"
        self.sentinel.mkdir(parents=True, exist_ok=True)
        (self.sentinel / "secret.txt").write_text("do not touch\n")
        digest, data = agent_zip()
        self.agent = self.root / "agent" / f"agent-{digest}.pyz"
        self.agent.parent.mkdir(parents=True, exist_ok=True)
        self.agent.write_bytes(data)
        client = AgentClient(LocalTransport(), str(self.root), sys.executable)
        client.call([Op("blobs_store", {"blobs": [{"sha256": sha(d), "size": len(d)} for d in GOOD]})],
                    payload=b"".join(GOOD))
        self.before = self.outside()

    def outside(self) -> dict:
        """Everything outside the root, by name, with mode and content."""
        out = {}
        for p in sorted(self.base.rglob("*")):
            if p == self.root or self.root in p.parents:
                continue
            st_ = os.lstat(p)
            out[str(p)] = (st_.st_mode, st_.st_nlink, p.read_bytes() if p.is_file() and not p.is_symlink() else b"")
        return out

    def send(self, stdin: bytes) -> tuple[dict, bytes]:
        proc = subprocess.run([sys.executable, str(self.agent)], input=stdin, capture_output=True, timeout=60)
        assert b"Traceback" not in proc.stderr and proc.returncode == 0, proc.stderr.decode()[-2000:]
        assert proc.stdout.count(MARK_BEGIN) == 1 and proc.stdout.endswith(MARK_END), proc.stdout[-500:]
        return unframe(proc.stdout), proc.stdout

    def request(self, ops: list, **extra) -> bytes:
        return json.dumps({"v": 1, "root": str(self.root), "ops": ops, "lock": None, "payload": 0, **extra}).encode()


@pytest.fixture(scope="module")
def wire(tmp_path_factory):
    return Wire(tmp_path_factory.mktemp("wire"))


def first_error(envelope: dict) -> dict:
    if "fatal" in envelope:
        return envelope["fatal"]
    failed = [r for r in envelope["results"] if not r["ok"]]
    assert failed, envelope
    return failed[0]["error"]


def _files() -> list[dict]:
    return [{"path": "train.py", "sha256": sha(GOOD[0]), "mode": 0o644, "size": len(GOOD[0])},
            {"path": "bin/run.sh", "sha256": sha(GOOD[1]), "mode": 0o755, "size": len(GOOD[1])}]


EVIL_PATHS = ["../sentinel/x", "/abs/x", "bin//x", "./train.py", "bin/../../sentinel/y", "", ".", "..", "bin/",
              "x/./y", "a\0b", "a" * 300, ".orch-manifest.json", "\ud800", 7, None]
EVIL_SHAS = ["../../sentinel/secret.txt", sha(b"x").upper(), sha(b"x")[:63], sha(b"x") + "0", "", 12, None,
             "/" + sha(b"x")[1:], "g" * 64]
EVIL_MODES = [0o777, 0o4755, 0o600, "644", True, -1, 0o644 + 0.5, None, 1 << 70]


@st.composite
def crafted_manifest(draw) -> list:
    """A good manifest with one thing made wrong: every result must be an input error."""
    files = _files()
    i = draw(st.integers(0, len(files) - 1))
    kind = draw(st.sampled_from(["path", "sha256", "mode", "duplicate", "entry", "extra-dir-file"]))
    if kind == "path":
        files[i]["path"] = draw(st.sampled_from(EVIL_PATHS) | st.text(min_size=1, max_size=8).map(lambda t: "../" + t))
    elif kind == "sha256":
        files[i]["sha256"] = draw(st.sampled_from(EVIL_SHAS))
    elif kind == "mode":
        files[i]["mode"] = draw(st.sampled_from(EVIL_MODES))
    elif kind == "duplicate":
        files.append(dict(files[i], sha256=sha(GOOD[1 - i]), mode=0o644))
    elif kind == "entry":
        files[i] = draw(st.sampled_from([[], "train.py", 3, None, {"path": "a"}]))
    else:
        files.append(dict(files[i], path=files[i]["path"] + "/" + draw(st.sampled_from(["x", "y/z"]))))
    return files


def _revision(files: list) -> str:
    try:
        return manifest_id(files)
    except Exception:  # the manifest is too broken to hash: any well-formed id
        return "0123456789abcdef"


@SETTINGS
@given(files=crafted_manifest())
def test_crafted_manifests_get_an_input_error_and_touch_nothing_outside_the_root(wire, files):
    ops = [{"op": "revision_assemble", "args": {"revision": _revision(files), "files": files}}]
    envelope, _ = wire.send(wire.request(ops))
    error = first_error(envelope)
    assert error["kind"] == "input", error
    assert "traceback" not in error
    assert wire.outside() == wire.before
    assert not [p for p in (wire.root / "revisions").iterdir() if not p.name.startswith(".tmp-")]
    assert not list((wire.root / "revisions").glob(".tmp-*"))


@settings(SETTINGS, max_examples=20)
@given(names=st.lists(st.sampled_from(EVIL_SHAS) | st.text(max_size=70), min_size=1, max_size=4),
       store=st.booleans())
def test_crafted_blob_names_are_refused_by_missing_and_store(wire, names, store):
    names = [sha(GOOD[0]), *names]
    op, args = ("blobs_store", {"blobs": [{"sha256": n, "size": 0} for n in names]}) if store \
        else ("blobs_missing", {"hashes": names})
    envelope, _ = wire.send(wire.request([{"op": op, "args": args}]))
    assert first_error(envelope)["kind"] == "input"
    assert wire.outside() == wire.before


def test_a_valid_manifest_still_assembles(wire):
    files = _files()
    envelope, _ = wire.send(wire.request([{"op": "revision_assemble",
                                           "args": {"revision": manifest_id(files), "files": files}}]))
    assert envelope["results"][0]["ok"], envelope
    built = wire.root / "revisions" / manifest_id(files)
    assert (built / "bin" / "run.sh").read_bytes() == GOOD[1]


BAD_ARGS = [
    ("log_read", {"exp_id": "../../sentinel"}), ("log_read", {"exp_id": True}), ("log_read", {"exp_id": -1}),
    ("run_verify", {"exp_id": 1.5}), ("status", {"project": "../x"}), ("status", {"ids": ["1"]}),
    ("run_stop", {"project": "a/b", "ids": None, "stop_timeout": 1, "term_timeout": 1}),
    ("run_start", {"exp_id": 1, "project": "p", "revision": "../../sentinel", "argv": ["true"], "env": {},
                   "experiment": {}, "batching": {}}),
    ("ckpt_restore", {"path": "/x", "configured": "/x", "name": "../sentinel"}),
    ("ckpt_trash", {"path": "/x", "configured": "/x", "label": "../../sentinel/evil"}),
    ("ckpt_purge", {"path": "/x", "configured": "/x", "names": [".."]}),
    ("revision_assemble", {"revision": "../sentinel"}), ("shell", {"argv": "true"}),
    ("preflight", {"min_free_mb": "50"}), ("no_such_op", {}),
]


@pytest.mark.parametrize("op,args", BAD_ARGS, ids=[f"{o}-{i}" for i, (o, _) in enumerate(BAD_ARGS)])
def test_ill_typed_op_arguments_are_input_errors(wire, op, args):
    envelope, _ = wire.send(wire.request([{"op": "hello"}, {"op": op, "args": args}]))
    # every op's arguments are checked before the first op runs: the hello before it never ran either
    assert envelope["results"] == [] if op in ARGS else envelope["results"][0]["ok"], envelope
    assert first_error(envelope)["kind"] == "input"
    assert wire.outside() == wire.before


def _mutated(field: str, value) -> dict:
    req = {"v": 1, "root": "ROOT", "ops": [{"op": "hello", "args": {}}], "lock": None, "payload": 0}
    if value is _DROP:
        req.pop(field)
    else:
        req[field] = value
    return req


_DROP = object()
JUNK = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5) \
    | st.lists(st.integers(), max_size=2) | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)
GARBAGE = st.one_of(
    st.binary(max_size=200).filter(lambda b: b.strip()[:1] not in (b"{", b"")),   # not JSON, or not an object
    (st.none() | st.integers() | st.text(max_size=10) | st.lists(st.integers(), max_size=3))
    .map(lambda v: json.dumps(v).encode()),
    st.integers(1, 5000).map(lambda n: b"[" * n),
    st.tuples(st.sampled_from(["root", "ops", "lock", "payload"]), JUNK | st.just(_DROP))
    .filter(lambda fv: not (fv[0] in ("lock", "payload") and (fv[1] is None or fv[1] is _DROP)))
    .filter(lambda fv: not (fv[0] == "lock" and type(fv[1]) in (int, float) and 0 <= fv[1] <= 1e9))
    .filter(lambda fv: not (fv[0] == "payload" and type(fv[1]) is int and fv[1] >= 0))
    .filter(lambda fv: not (fv[0] == "ops" and (fv[1] is _DROP or fv[1] == [])))
    .map(lambda fv: _mutated(*fv)),
    st.sampled_from([{"op": 3}, {"args": {}}, "hello", {"op": "hello", "args": []}, {"op": "nope"}])
    .map(lambda item: _mutated("ops", [item])),
)


@SETTINGS
@given(garbage=GARBAGE)
def test_garbage_requests_get_one_clean_input_envelope(wire, garbage):
    if isinstance(garbage, dict):
        if garbage.get("root") == "ROOT":
            garbage["root"] = str(wire.root)
        data = json.dumps(garbage).encode()
    else:
        data = garbage
    envelope, _ = wire.send(data.replace(b"\n", b" ") + b"\n")
    error = first_error(envelope)
    assert error["kind"] == "input", (data[:200], error)
    assert "traceback" not in error
    assert wire.outside() == wire.before


class Canned(Transport):
    """A transport whose agent always answers the same bytes: the controller's parsing under test."""

    description = "canned"

    def __init__(self, stdout: bytes, exit_code: int = 0) -> None:
        super().__init__()
        self.stdout, self.exit_code = stdout, exit_code

    def run(self, argv, *, input=None, timeout=None) -> Result:
        return Result(list(argv), self.exit_code, self.stdout, b"")

    def put(self, data, path, mode=0o644) -> None:
        raise AssertionError("no push expected")


def _frame_raw(body: bytes) -> bytes:
    return MARK_BEGIN + body + MARK_END


ANSWERS = st.one_of(
    st.binary(max_size=100).map(_frame_raw),                                      # garbage between the markers
    st.binary(max_size=100).map(lambda b: MARK_BEGIN + b),                        # truncated frame
    JUNK.map(lambda v: frame(v) if isinstance(v, dict) else _frame_raw(json.dumps(v).encode())),
    JUNK.map(lambda v: frame({"v": 1, "results": v})),                            # results not a list
    st.lists(JUNK, max_size=3).map(lambda v: frame({"v": 1, "results": v})),      # items not results
    JUNK.map(lambda v: frame({"v": 1, "results": [], "fatal": v})),
    st.integers(0, 1).map(lambda n: frame({"v": 1, "results": [{"ok": True, "value": 1}] * n})),  # too few
    JUNK.map(lambda v: frame({"v": 1, "results": [{"ok": False, "error": {"kind": v, "message": v}}]})),
)


@settings(max_examples=150, deadline=None)
@given(answer=ANSWERS)
def test_the_controller_turns_any_malformed_answer_into_a_clean_agent_error(answer):
    client = AgentClient(Canned(answer), "/nowhere", "python3")
    try:
        client.call([Op("hello"), Op("hello")])
    except AgentError as exc:
        assert exc.hint and "\n" not in exc.message
    except InputError:  # a well-formed error answer of kind input (hypothesis found "input" as a kind)
        pass
    except Exception as exc:  # noqa: BLE001 - the point: nothing else escapes
        pytest.fail(f"{type(exc).__name__}: {exc} for {answer[:200]!r}")
    else:
        pytest.fail(f"accepted {answer!r}")


def test_an_unexpected_failure_keeps_its_traceback_and_what_was_done(tmp_path):
    """A real agent bug (a purge list of the wrong shape): the earlier ops' results come back with the traceback."""
    ckpt = tmp_path / "root" / "checkpoints"
    (ckpt / "step1").mkdir(parents=True)
    (ckpt / "step1" / "model.pt").write_bytes(b"w")
    client = AgentClient(LocalTransport(), str(tmp_path / "root"), sys.executable)
    base = {"path": str(ckpt), "configured": str(ckpt)}
    with pytest.raises(AgentError) as info:
        client.call([Op("hello"), Op("ckpt_inventory", base),
                     Op("ckpt_trash", {**base, "label": "exp1", "purge": True, "purge_only": [{}]})])
    err = info.value
    assert err.message.startswith("agent failure in ckpt_trash: KeyError") and "\n" not in err.message
    assert "--verbose" in (err.hint or "")
    assert "Traceback" in err.detail and "_purge_new_entry" in err.detail
    assert [v["protocol"] for v in err.partial[:1]] == [1] and err.partial[1]["files"] == 1
    # a failure after the trash op: its entry (where the checkpoints now are) reaches the caller
    (ckpt / "step2.pt").write_bytes(b"w")
    with pytest.raises(AgentError) as info:
        client.call([Op("ckpt_trash", {**base, "label": "exp2"}), Op("shell", {"argv": ["false"]})])
    moved = info.value.partial[0]
    assert moved["action"] == "moved" and Path(moved["entry_path"], "step2.pt").is_file()


def test_an_unexpected_failure_about_a_run_leaves_its_traceback_in_the_run_folder(tmp_path):
    run = tmp_path / "root" / "runs" / "5"
    run.mkdir(parents=True)
    (run / "experiment.json").write_text("{}")
    (run / "pid.json").write_text("[1, 2]")  # damaged by hand: not the object the agent writes
    client = AgentClient(LocalTransport(), str(tmp_path / "root"), sys.executable)
    with pytest.raises(AgentError) as info:
        client.call([Op("run_verify", {"exp_id": 5, "wait": 0})])
    assert "\n" not in info.value.message and "Traceback" in info.value.detail
    saved = (run / "agent-failure.txt").read_text()
    assert info.value.message in saved and "Traceback" in saved
