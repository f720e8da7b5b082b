"""The restart policy and checkpoint choice of the on-target supervisor (pure, plus a real folder)."""

from __future__ import annotations

import os

from orchestrator.agent.run.attempts import History, Policy, marker, newest_checkpoint, summary


def test_policy_restarts_failures_until_exhausted():
    p = Policy.from_dict({"restarts": 2, "backoff": [0.2, 1]})
    assert p.attempts == 3
    assert p.restart_after(0, 1, "exit code 1") and p.restart_after(1, 0, "stalled")
    assert not p.restart_after(2, 1, "exit code 1")  # exhausted
    assert not p.restart_after(0, 0, "exit code 0")  # success
    assert not p.restart_after(0, 130, "stopped")  # a stop is never a failure
    assert Policy.from_dict({"restarts": 1, "restart_on": "always"}).restart_after(0, 0, "exit code 0")
    assert [p.delay(n) for n in (1, 2, 3, 9)] == [0.2, 1, 1, 1]
    assert not Policy.from_dict(None).restart_after(0, 1, "exit code 1")


def test_newest_checkpoint_by_mtime_ignoring_hidden_and_glob(tmp_path):
    assert newest_checkpoint(str(tmp_path)) == "" and newest_checkpoint("") == ""
    for i, name in enumerate(["ckpt-1.pt", "ckpt-2", "notes.txt", ".orch-trash"]):
        (tmp_path / name).mkdir() if "." not in name[1:] else (tmp_path / name).write_text("x")
        os.utime(tmp_path / name, (1000 + i, 1000 + i))
    assert newest_checkpoint(str(tmp_path)) == str(tmp_path / "notes.txt")
    assert newest_checkpoint(str(tmp_path), "ckpt-*") == str(tmp_path / "ckpt-2")
    assert newest_checkpoint(str(tmp_path), "*.pt") == str(tmp_path / "ckpt-1.pt")


def test_history_is_kept_in_the_run_folder(tmp_path):
    p = Policy.from_dict({"restarts": 3})
    h = History(str(tmp_path), p)
    h.begin("")
    h.end(1, "exit code 1")
    assert marker(1, p.attempts, h.items[-1], "/c/ckpt-4.pt") == \
        "[orch] attempt 2 of 4 after exit code 1; resuming from /c/ckpt-4.pt\n"
    h.begin("/c/ckpt-4.pt")
    again = History(str(tmp_path), p)  # a new supervisor (after a reboot) continues the record
    again.close_lost()
    s = summary(str(tmp_path))
    assert s["attempt"] == 2 and s["max_attempts"] == 4 and s["last_reason"] == "lost"
    assert s["resumed_from"] == "/c/ckpt-4.pt" and s["attempts"][0]["exit_code"] == 1


def test_an_attempt_ended_by_the_shutdown_costs_no_restart_and_is_named_in_the_log(tmp_path):
    p = Policy.from_dict({"restarts": 1})
    h = History(str(tmp_path), p)
    h.begin("")
    h.end(143, "interrupted by the container's shutdown")
    again = History(str(tmp_path), p)  # the supervisor the reboot unit starts at boot
    assert again.lost == 1 and again.data["max"] == 3  # the restart is still there
    assert marker(1, again.data["max"], again.items[-1], "/c/ckpt-4.pt") == \
        "[orch] attempt 2 of 3 after the container's shutdown; resuming from /c/ckpt-4.pt\n"
    assert summary(str(tmp_path))["last_reason"] == "interrupted by the container's shutdown"
