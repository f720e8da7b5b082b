"""What the target says, read inside the CT (stdlib only): ``python3 - ROOT WORKSPACE < chaos_probe.py``.

It waits for orch's target lock (``ROOT/.lock``) and holds it while it reads, so no locked operation is half
way through what it sees. It prints one JSON object:

    {"lock_wait": 0.01, "runs": {"<registry>-<n>": {"state": "live|ended|failed|dead|nopid", "exit_code": 0}},
     "files": {"/workspace/checkpoints/ckpt-1.pt": "<sha256>"}, "bad_revisions": {"<id>": "why"},
     "tmp": ["/workspace/orch/blobs/.tmp-x"]}

``files`` holds every file under WORKSPACE outside ROOT (checkpoint folders and their trash).
"""

import fcntl
import hashlib
import json
import os
import sys
import time

LOCK_WAIT = 30.0


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_json(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def alive(pid, started=None):
    """Whether ``pid`` runs and is the process that started at ``started`` (after a reboot its pid may be
    another process's)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        with open("/proc/%d/stat" % pid) as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] != "Z" and (started is None or (len(fields) > 19 and fields[19] == str(started)))


def run_state(folder):
    ended = read_json(os.path.join(folder, "exit.json"))
    pid = read_json(os.path.join(folder, "pid.json"))
    if isinstance(ended, dict) and ended.get("not_started"):
        return {"state": "failed"}
    if isinstance(ended, dict):
        return {"state": "ended", "exit_code": ended.get("exit_code")}
    if isinstance(pid, dict):
        live = alive(pid.get("supervisor"), pid.get("supervisor_start")) or \
            alive(pid.get("child"), pid.get("child_start"))
        return {"state": "live" if live else "dead"}
    return {"state": "nopid"}


def runs(root):
    folder = os.path.join(root, "runs")
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return {}
    return {n: run_state(os.path.join(folder, n)) for n in names if not n.startswith(".")}


def bad_revisions(root):
    """Each ``revisions/<id>`` must hold its manifest and every file it lists, byte for byte."""
    folder, bad = os.path.join(root, "revisions"), {}
    try:
        names = os.listdir(folder)
    except OSError:
        return bad
    for name in names:
        if ".tmp-" in name:
            continue  # reported by tmp()
        manifest = read_json(os.path.join(folder, name, ".orch-manifest.json"))
        if not isinstance(manifest, dict) or manifest.get("revision") != name:
            bad[name] = "no manifest"
            continue
        for entry in manifest.get("files", []):
            path = os.path.join(folder, name, entry["path"])
            try:
                if sha256(path) != entry["sha256"]:
                    bad[name] = "%s differs from its manifest" % entry["path"]
            except OSError:
                bad[name] = "%s is missing" % entry["path"]
    return bad


def tmp(root):
    found = []
    for parent, dirs, names in os.walk(root):
        found += [os.path.join(parent, n) for n in dirs + names if ".tmp-" in n]
        dirs[:] = [d for d in dirs if ".tmp-" not in d]
    return sorted(found)


def files(workspace, root):
    out = {}
    for parent, dirs, names in os.walk(workspace):
        dirs[:] = [d for d in dirs if os.path.join(parent, d) != root]
        for name in names:
            path = os.path.join(parent, name)
            try:
                out[path] = sha256(path)
            except OSError:
                pass
    return out


def main():
    root, workspace = sys.argv[1], sys.argv[2]
    begin = time.monotonic()
    fd = None
    if os.path.isdir(root):
        fd = os.open(os.path.join(root, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() - begin > LOCK_WAIT:
                    print(json.dumps({"lock_wait": None}))
                    return
                time.sleep(0.05)
    try:
        out = {"lock_wait": round(time.monotonic() - begin, 3), "runs": runs(root),
               "files": files(workspace, root), "bad_revisions": bad_revisions(root), "tmp": tmp(root)}
    finally:
        if fd is not None:
            os.close(fd)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
