"""`orch status --watch`: the screen redrawn every 2 s with the run's progress, until Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

from tests.conftest import wait_for

CLEAR = "\x1b[2J\x1b[H"


def test_status_watch_redraws_the_run_as_it_goes_and_ends_on_ctrl_c(project):
    project.configure(steps=100000, sleep=0.05)
    assert project.cli("deploy", "-m", "watched").exit_code == 0
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "status", "--watch"], cwd=project.path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, ORCH_WARM="0"))
    screens: list[str] = []

    def read() -> None:
        buf = ""
        for chunk in iter(lambda: proc.stdout.read(1), ""):
            buf += chunk
            if buf.endswith(CLEAR):
                screens.append(buf[:-len(CLEAR)])
                buf = ""
        screens.append(buf)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_for(lambda: len(screens) >= 3 and "step=" in screens[-1], timeout=90,
                 what="three screens of orch status --watch, the last one past the run's first step")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        reader.join(timeout=10)
        err = proc.stderr.read()
        assert project.cli("stop").exit_code == 0
    drawn = [s for s in screens[1:] if s.strip()]  # the first chunk is what came before the first clear
    assert len(drawn) >= 2, screens
    for screen in drawn[:2]:
        assert "local: experiment 1 running" in screen and "message: watched" in screen, screen
        assert "last log line" in screen, screen
    assert any("step=" in screen for screen in drawn), drawn  # redrawn as the run goes past its first line
    assert proc.returncode == 130 and "Traceback" not in err, err
