"""paramiko's one loader (``sshlib``), in a fresh Python each time: threads that connect at once all get the whole
module, and invoke stays unloaded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# eight threads ask for paramiko at once, as a job's nodes or `status --all`'s targets connect together
RACE = """\
import json, sys, threading
sys.path.insert(0, sys.argv[1])
from orchestrator.reach.transport import sshlib
errors, start = [], threading.Barrier(8)
def connect():
    start.wait()
    try:
        mod = sshlib.paramiko()
        mod.SSHConfig(), mod.SSHClient, mod.Transport
    except Exception as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=connect) for _ in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps({"errors": errors, "invoke": "invoke" in sys.modules,
                  "same": sshlib.paramiko() is sys.modules["paramiko"]}))
"""


def test_threads_loading_paramiko_at_once_all_get_the_whole_module_without_invoke():
    for _ in range(3):  # the race lost about every time before the loader held a lock
        proc = subprocess.run([sys.executable, "-c", RACE, str(REPO)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        got = json.loads(proc.stdout)
        assert got == {"errors": [], "invoke": False, "same": True}
