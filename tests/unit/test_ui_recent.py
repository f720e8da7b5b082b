"""What the dashboard's server asks a target again and again (`orch status`, `orch checkpoints list`) is asked once a
while (`ui/recent.py`) and run behind the user's own commands (`ui/actions.run`): a user's `orch status` beside an
open page shares the machine with less of it."""

from __future__ import annotations

import os
import sys
import threading
import time

from orchestrator.ui import actions
from orchestrator.ui.recent import Recent


def test_a_recent_answer_is_given_again_until_it_is_old_or_forgotten():
    recent, asked = Recent(keep_s=0.3), []

    def ask(ok: bool = True):
        asked.append(1)
        return actions.Answer(ok, {"n": len(asked)}, 0 if ok else 1)

    assert recent.get(("status", "p", 7), ask).data == {"n": 1}
    assert recent.get(("status", "p", 7), ask).data == {"n": 1} and len(asked) == 1
    assert recent.get(("checkpoints", "p", 7), ask).data == {"n": 2}  # another question, asked
    recent.forget(7)  # a stop from the page: asked anew
    assert recent.get(("status", "p", 7), ask).data == {"n": 3}
    time.sleep(0.35)
    assert recent.get(("status", "p", 7), ask).data == {"n": 4}
    assert not recent.get(("status", "p", 8), lambda: ask(False)).ok  # a failure is not kept
    assert recent.get(("status", "p", 8), ask).data == {"n": 6}


def test_pages_asking_at_once_share_one_answer():
    recent, asked, got = Recent(), [], []

    def ask():
        asked.append(1)
        time.sleep(0.2)
        return actions.Answer(True, {"n": len(asked)}, 0)

    threads = [threading.Thread(target=lambda: got.append(recent.get(("status", "p", 1), ask).data)) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(asked) == 1 and got == [{"n": 1}] * 5


def test_a_read_the_page_repeats_runs_behind_the_users_commands(tmp_path):
    code = "import os, subprocess, sys; print(os.nice(0), subprocess.run([sys.executable, '-c', " \
           "'import os; print(os.nice(0))'], capture_output=True, text=True).stdout.strip())"
    done = actions.run([sys.executable, "-c", code], tmp_path, 30, actions.NICE)
    base = os.nice(0)
    assert done.returncode == 0 and done.stdout.split() == [str(min(19, base + actions.NICE))] * 2  # its agents too
    assert actions.run([sys.executable, "-c", code], tmp_path, 30).stdout.split() == [str(base)] * 2
