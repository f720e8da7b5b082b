"""The chaos test's invariants catch what they claim to (pure functions over made-up probes and rows)."""

from __future__ import annotations

from types import SimpleNamespace

from tests.testbed import chaos_checks as checks
from tests.testbed.chaos_clones import Outcome

REG = "0123456789ab"


def probe(runs=None, files=None, bad=None, tmp=None) -> dict:
    return {"lock_wait": 0.0, "runs": runs or {}, "files": files or {}, "bad_revisions": bad or {}, "tmp": tmp or []}


def row(n: int, status: str, exit_code=None):
    return SimpleNamespace(id=n, status=status, exit_code=exit_code)


def test_rows_that_match_the_target_pass():
    before = probe({f"{REG}-1": {"state": "ended", "exit_code": 0}, f"{REG}-2": {"state": "live"}})
    after = probe({f"{REG}-1": {"state": "ended", "exit_code": 0}, f"{REG}-2": {"state": "ended", "exit_code": 0}})
    rows = [row(1, "finished", 0), row(2, "running"), row(3, "failed")]  # 2 ended on its own during status
    assert checks.rows_agree("A", REG, rows, before, after) == []


def test_rows_that_lie_are_named():
    live = probe({f"{REG}-1": {"state": "live"}, f"{REG}-2": {"state": "ended", "exit_code": 1},
                  f"{REG}-4": {"state": "live"}, f"{REG}-5": {"state": "ended", "exit_code": 0}})
    rows = [row(1, "stopped"), row(2, "running"), row(3, "launching"), row(5, "crashed", 1)]
    problems = checks.rows_agree("A", REG, rows, live, live)
    assert any("row 1 is stopped, the target's run is live" in p for p in problems)
    assert any("row 2 is running, the target says ended" in p for p in problems)
    assert any("row 3 is launching" in p for p in problems)
    assert any(f"run {REG}-4 is live on the target, clone A says nothing" in p for p in problems)
    assert any("row 5 has exit code 1, the target's exit.json 0" in p for p in problems)


def test_a_checkpoint_counts_if_it_is_in_the_folder_or_a_trash_entry_byte_for_byte():
    seen = {"/w/ck/ckpt-1.pt": "aa", "/w/ck/ckpt-2.pt": "bb", "/w/ck/ckpt-3.pt": "cc"}
    after = probe(files={"/w/ck/ckpt-1.pt": "aa", "/w/ck.trash/x-exp1/ckpt-2.pt": "bb", "/w/ck/ckpt-3.pt": "zz"})
    problems = checks.checkpoints_kept(seen, after)
    assert len(problems) == 1 and "/w/ck/ckpt-3.pt" in problems[0]
    assert checks.checkpoint_folder_files(after) == {"/w/ck/ckpt-1.pt": "aa", "/w/ck/ckpt-3.pt": "zz"}


def test_half_revisions_and_lasting_temporary_files_are_named():
    before = probe(tmp=["/r/blobs/.tmp-1", "/r/runs/x/.tmp-2"])
    after = probe(bad={"abc": "no manifest"}, tmp=["/r/blobs/.tmp-1"])
    assert checks.target_tidy(before, after) == ["revision abc is half made: no manifest",
                                                 "orphan temporary file /r/blobs/.tmp-1"]


def test_errors_must_be_one_error_line_and_a_hint_without_a_traceback():
    ok = Outcome(["stop"], "A", returncode=3, stderr="error: cannot reach ct200\nhint: check [ssh]\n")
    assert checks.clean_output(ok, 60) == []
    bare = Outcome(["stop"], "A", returncode=1, stderr="something broke\n")
    trace = Outcome(["deploy"], "B", returncode=1, stderr="Traceback (most recent call last):\n  ...\nKeyError\n")
    hung = Outcome(["deploy"], "B", returncode=-9, hung=True)
    killed = Outcome(["deploy"], "B", returncode=-9, signalled="SIGKILL")
    interrupted = Outcome(["deploy"], "B", returncode=130, signalled="SIGINT", stderr="interrupted: nothing done\n")
    assert "without one error: line" in checks.clean_output(bare, 60)[0]
    assert "traceback" in checks.clean_output(trace, 60)[0]
    assert "hung past its 60 s timeout" in checks.clean_output(hung, 60)[0]
    assert checks.clean_output(killed, 60) == checks.clean_output(interrupted, 60) == []


def test_a_remedy_that_fails_on_a_full_disk_is_named():
    ok = Outcome(["checkpoints", "list", "--json"], "A", returncode=0)
    bad = Outcome(["checkpoints", "purge", "e1", "--yes"], "B", returncode=1,
                  stderr="error: no space left on device: /workspace/orch/.lock\nhint: free some space\n")
    assert checks.succeeded([ok], "on a full disk") == []
    [problem] = checks.succeeded([ok, bad], "on a full disk")
    assert problem.startswith("clone B `orch checkpoints purge e1 --yes` on a full disk exited 1: error: no space")


def job_row(n: int, status: str, nodes: list[str | None]):
    return SimpleNamespace(id=n, status=status, exit_code=None,
                           nodes=[{"rank": r, "state": s} for r, s in enumerate(nodes)])


def test_a_job_row_agrees_with_both_nodes_or_is_named():
    from tests.testbed.chaos_jobs import job_rows_agree

    key = f"{REG}-1"
    running = {200: probe({key: {"state": "live"}}), 201: probe({key: {"state": "live"}})}
    half = {200: probe({key: {"state": "ended", "exit_code": 0}}), 201: probe({key: {"state": "live"}})}
    over = {200: probe({key: {"state": "ended", "exit_code": 0}}), 201: probe({key: {"state": "ended"}})}
    assert job_rows_agree("J", REG, [job_row(1, "running", ["finished", "running"])], half, half) == []
    assert job_rows_agree("J", REG, [job_row(1, "stopped", ["stopped", "stopped"])], over, over) == []
    assert job_rows_agree("J", REG, [job_row(1, "failed", ["failed", None])], over, over) == []  # start undone
    lying = job_rows_agree("J", REG, [job_row(1, "stopped", ["stopped", "stopped"])], half, half)
    assert any("job 1 is stopped, a node's run is live" in p for p in lying), lying
    assert any("job 1 node 1 is stopped, its run is live" in p for p in lying), lying
    assert any(f"run {key} is live on CT 201, clone J says stopped" in p for p in lying), lying
    stale = job_rows_agree("J", REG, [job_row(1, "running", ["running", "running"])], over, over)
    assert any("job 1 is running, the nodes say ['ended', 'ended']" in p for p in stale), stale
    unknown = job_rows_agree("J", REG, [], running, running)
    assert any(f"run {key} is live on CT 200, clone J says nothing" in p for p in unknown), unknown
    assert any("is launching" in p for p in job_rows_agree("J", REG, [job_row(1, "launching", [None, None])],
                                                            running, running))


def test_a_ctrl_c_in_pythons_own_start_up_may_end_it_without_a_word_but_not_in_orchs():
    site = ('Traceback (most recent call last):\n  File "/v/lib/python3.11/site-packages/__editable___finder.py", '
            'line 5, in <module>\nKeyboardInterrupt\n')
    orch = site.replace("site-packages/__editable___finder.py", "site-packages/orchestrator/warm/server.py")

    def sigint(code: int, err: str) -> Outcome:
        return Outcome(["deploy"], "A", code, "", err, signalled="SIGINT")

    assert checks.clean_output(sigint(-2, ""), 60) == []  # killed by the signal before Python had a handler
    assert checks.clean_output(sigint(1, site), 60) == []
    assert checks.clean_output(sigint(130, "interrupted: nothing was done\n"), 60) == []
    assert "without saying what was done" in checks.clean_output(sigint(130, ""), 60)[0]
    assert "printed a traceback" in checks.clean_output(sigint(1, orch), 60)[0]
    assert "printed a traceback" in checks.clean_output(Outcome(["deploy"], "A", 1, "", site), 60)[0]
