"""The launch journal: written by a real locked agent call, read back whole after a crash cut its last line,
and turned into registry facts (real agent process, real files)."""

from __future__ import annotations

import json
import os
import sys

from orchestrator.records import launch_journal
from orchestrator.agent import journal
from orchestrator.reach.agent_client import AgentClient, Op
from orchestrator.errors import NotFoundError
from orchestrator.reach.transport.local import LocalTransport

REGISTRY = "0123456789ab"


def test_a_missing_journal_reads_as_nothing(tmp_path):
    assert journal.read(str(tmp_path / "no-such-run")) == []
    assert launch_journal.facts([]) == {"known": False, "planned": [], "trash": None, "stopped": [],
                                        "started": False, "failed": None, "finished": False,
                                        "underway": False}


def test_a_launch_reads_underway_while_its_agent_holds_the_lock_and_cut_once_it_does_not(tmp_path):
    """A journal without its end: the launch still runs its steps while its agent holds the target's lock (a
    stop, then the start), and was cut when nobody holds it, or another process does."""
    from orchestrator.agent.layout import Layout
    from orchestrator.agent.lock import TargetLock

    layout = Layout(str(tmp_path / "root"))
    layout.ensure()
    run_dir = layout.run_dir(2, REGISTRY)
    steps = journal.Journal(run_dir)
    steps.begin("deploy", ["run_stop", "run_start"], exp_id=2, registry=REGISTRY, project="p")

    def underway() -> bool:
        return launch_journal.facts(journal.read_many(layout, [2], REGISTRY)["2"])["underway"]

    with TargetLock(layout.lock, 1, "deploy"):  # held by this process, the one that began the journal
        assert underway()
    assert not underway()  # released without its end: its agent was cut
    with open(run_dir + "/" + journal.FILE) as fh:
        began = json.loads(fh.readline())
    assert began["pid"] == os.getpid()
    steps.end()
    with TargetLock(layout.lock, 1, "deploy"):
        assert not underway()  # it ended: whoever holds the lock now runs something else


def test_a_last_line_cut_by_a_crash_and_garbage_lines_are_left_out(tmp_path):
    lines = [json.dumps({"event": "begin", "what": "restart", "ops": ["run_stop", "ckpt_trash"]}),
             json.dumps({"event": "done", "op": "run_stop", "value": {"stopped": [{"id": 1, "exit_code": 130}]}}),
             "not json at all", json.dumps(["a", "list"]), json.dumps({"no": "event"}), "",
             json.dumps({"event": "done", "op": "ckpt_trash", "value": {"action": "moved"}})[:-7]]
    (tmp_path / journal.FILE).write_bytes("\n".join(lines).encode() + b"\xff\xfe")
    entries = journal.read(str(tmp_path))
    assert [e["event"] for e in entries] == ["begin", "done"]
    told = launch_journal.facts(entries)
    assert told["stopped"] == [{"id": 1, "exit_code": 130}] and told["trash"] is None and not told["finished"]
    assert launch_journal.checkpoint_fields(told) == {}  # the trash step's line never became whole


def test_a_launch_that_never_touches_checkpoints_kept_them_whatever_step_it_reached():
    """An agent killed between starting the run and journaling it: no trash step was planned, so the
    checkpoints were kept (a row reading "checkpoints -" would say nothing)."""
    told = launch_journal.facts([{"event": "begin", "ops": ["revision_assemble", "run_stop", "run_start"]},
                                 {"event": "done", "op": "run_stop", "value": {"stopped": []}}])
    assert not told["started"] and told["planned"][-1] == "run_start"
    assert launch_journal.checkpoint_fields(told) == {"checkpoints_action": "kept", "checkpoints_entry": None}
    cleaning = launch_journal.facts([{"event": "begin", "ops": ["run_stop", "ckpt_trash", "run_start"]}])
    assert launch_journal.checkpoint_fields(cleaning) == {}  # its trash step may have run: unknown


def test_an_empty_or_unreadable_journal_reads_as_nothing(tmp_path):
    (tmp_path / journal.FILE).write_bytes(b"")
    assert journal.read(str(tmp_path)) == []
    (tmp_path / journal.FILE).unlink()
    (tmp_path / journal.FILE).mkdir()  # not a file at all
    assert journal.read(str(tmp_path)) == []


def test_a_journal_never_writes_into_a_folder_that_is_not_its_own(tmp_path):
    run_dir = tmp_path / "runs" / f"{REGISTRY}-3"
    run_dir.mkdir(parents=True)
    (run_dir / "experiment.json").write_text("{}")
    steps = journal.Journal(str(run_dir))
    steps.begin("deploy", ["run_start"])
    steps.end()
    assert not (run_dir / journal.FILE).exists() and not steps.ok


def test_a_locked_call_journals_each_step_and_the_one_that_failed(tmp_path):
    root = tmp_path / "root"
    client = AgentClient(LocalTransport(), str(root), sys.executable)
    ckpt = root / "ckpt"
    ckpt.mkdir(parents=True)
    (ckpt / "step-5.pt").write_bytes(b"x" * 10)
    spec = {"exp_id": 7, "registry": REGISTRY, "project": "demo"}
    args = {"path": str(ckpt), "configured": str(ckpt)}
    try:
        client.call([Op("ckpt_trash", {**args, "label": "exp6", "moved_by": 7}),
                     Op("ckpt_restore", {**args, "name": "no-such-entry"})], lock=5, what="restart", journal=spec)
    except NotFoundError:
        pass
    run_dir = root / "runs" / f"{REGISTRY}-7"
    assert os.listdir(run_dir) == [journal.FILE]  # the run folder holds only the journal: free for its run
    assert journal.only_launch(str(run_dir))
    entries = journal.read(str(run_dir))
    assert [(e["event"], e.get("op")) for e in entries] == [
        ("begin", None), ("done", "ckpt_trash"), ("failed", "ckpt_restore"), ("end", None)]
    assert entries[0]["ops"] == ["ckpt_trash", "ckpt_restore"] and entries[0]["project"] == "demo"
    told = launch_journal.facts(client.one("journal_read", ids=[7, 8], registry=REGISTRY)["7"])
    fields = launch_journal.checkpoint_fields(told)
    assert fields["checkpoints_action"] == "moved"
    assert (root / "ckpt.trash" / os.path.basename(fields["checkpoints_entry"]) / "step-5.pt").exists()
    assert told["failed"]["op"] == "ckpt_restore" and not launch_journal.start_failed(told)
    assert client.one("journal_read", ids=[8], registry=REGISTRY) == {}


def test_steps_left_undone_because_orch_went_away_are_not_a_failed_start():
    entries = [{"event": "begin", "ops": ["run_stop", "run_start"]},
               {"event": "done", "op": "run_stop", "value": {"stopped": [{"id": 1, "state": "stopped"}]}},
               {"event": "failed", "op": "run_start", "error": {"kind": "cancelled", "message": "the controller went "
                                                                "away: the remaining steps were not run"}},
               {"event": "end"}]
    told = launch_journal.facts(entries)
    assert not launch_journal.start_failed(told)
    assert launch_journal.not_started(told, "launch interrupted") == "launch interrupted"
    assert launch_journal.stopped_reason(2, told) == "stopped by experiment 2"
    entries[2]["error"] = {"kind": "agent", "message": "tmux refused"}
    told = launch_journal.facts(entries)
    assert launch_journal.not_started(told, "launch interrupted") == "launch failed at run_start: tmux refused"
    assert launch_journal.stopped_reason(2, told) == "stopped by experiment 2 (whose start then failed)"


def test_every_line_its_reader_acts_on_is_fsynced_as_written_and_the_checks_ride_on_the_next(tmp_path, monkeypatch):
    """A stop, a checkpoint move, a start and a failure are on disk before the next step starts; a check, the blobs
    stored, the revision assembled, the start verified and the end (nothing the reader acts on) are appended without
    an fsync of their own, and the next fsynced line takes them to disk with it."""
    run_dir = str(tmp_path / "runs" / "0123456789ab-4")
    synced: list[list[str]] = []  # at each fsync of the journal: the ops of its lines so far
    real = os.fsync

    def fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}") == journal.path_in(run_dir):
            synced.append([e.get("op") or e["event"] for e in journal.read(run_dir)])
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    steps = journal.Journal(run_dir)
    ops = ["blobs_store", "revision_assemble", "run_check", "run_stop", "ckpt_trash", "run_start", "run_verify"]
    steps.begin("deploy", ops, exp_id=4, registry=REGISTRY, project="p")
    for op in ops:
        steps.step(op, {"ok": True, "value": {}})
    steps.step("run_check", {"ok": False, "error": {"kind": "conflict", "message": "no"}})
    steps.end()
    assert [s[-1] for s in synced] == ["begin", "run_stop", "ckpt_trash", "run_start", "run_check"]
    assert synced[1] == ["begin", "blobs_store", "revision_assemble", "run_check", "run_stop"]  # taken along
    assert [e.get("event") for e in journal.read(run_dir)][-2:] == ["failed", "end"]
