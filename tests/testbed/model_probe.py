"""What the model-based test reads inside the CT besides ``chaos_probe.py`` (stdlib only):
``python3 - ROOT SECRET < model_probe.py``. One JSON object:

    {"runs": {"<registry>-<n>": {"env": {...launch.json's env...}, "secrets": true,
              "starts": [{"exp": "3", "resumed": "/p.pt", "writer": "2", "env": {...}}, ...]}},
     "secret_in": ["/workspace/orch/runs/x/launch.json"], "queued": 1}

``starts`` are the ``model-start`` lines the test's script printed, one per start of its command (a resume after
a reboot or an attempt prints another). ``secret_in``: every file under ``/workspace``, ``/etc/systemd/system``
and ``/run/orch*`` that holds the secret's value.
"""

import json
import os
import sys

MARK = "model-start "
SEARCHED = ("/workspace", "/etc/systemd/system", "/run", "/tmp")


def read_json(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def starts(log):
    found = []
    try:
        with open(log, errors="replace") as fh:
            for line in fh:
                if line.startswith(MARK):
                    try:
                        found.append(json.loads(line[len(MARK):]))
                    except ValueError:
                        pass
    except OSError:
        pass
    return found


def runs(root):
    folder = os.path.join(root, "runs")
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return {}
    out = {}
    for name in names:
        if name.startswith("."):
            continue
        launch = read_json(os.path.join(folder, name, "launch.json")) or {}
        out[name] = {"env": launch.get("env") or {}, "secrets": bool(launch.get("secrets")),
                     "starts": starts(os.path.join(folder, name, "train.log"))}
    return out


def holding(secret):
    needle = secret.encode()
    found = []
    for top in SEARCHED:
        for parent, dirs, names in os.walk(top):
            for name in names:
                path = os.path.join(parent, name)
                try:
                    if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) > 64 << 20:
                        continue
                    with open(path, "rb") as fh:
                        if needle in fh.read():
                            found.append(path)
                except OSError:
                    pass
    return sorted(found)


def queued(root):
    folder = os.path.join(root, "queue")
    try:
        projects = os.listdir(folder)
    except OSError:
        return 0
    return sum(1 for p in projects if os.path.isdir(os.path.join(folder, p))
               for n in os.listdir(os.path.join(folder, p)) if n.endswith(".json") and not n.startswith("."))


def main():
    root, secret = sys.argv[1], sys.argv[2]
    print(json.dumps({"runs": runs(root), "secret_in": holding(secret), "queued": queued(root)}))


if __name__ == "__main__":
    main()
