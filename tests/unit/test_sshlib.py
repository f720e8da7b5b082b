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


VERSION = """\
import json, sys
sys.path.insert(0, sys.argv[1])
from orchestrator.reach.transport import sshlib
mod = sshlib.paramiko()
loaded = "importlib.metadata" in sys.modules
import importlib.metadata
print(json.dumps({"loaded": loaded, "version": mod.__version__, "real": importlib.metadata.version("paramiko"),
                  "files": bool(importlib.metadata.files("paramiko"))}))
"""


def test_paramiko_loads_without_importlib_metadata_and_still_knows_its_version():
    """paramiko asks importlib.metadata for its own version as it loads; the loader answers that from its
    dist-info folder, so a keeper's start does not load the real module (email, a walk of sys.path). Whoever asks
    importlib.metadata afterwards gets the real one, whole."""
    proc = subprocess.run([sys.executable, "-c", VERSION, str(REPO)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["loaded"] is False and got["version"] == got["real"] and got["files"] is True
