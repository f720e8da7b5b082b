"""The chaos loop's job: a third clone, J, of its own project ``chaosjob``, runs a 2-node job over CTs 200 and
201 (real torchrun, gloo on CPU, ``tests/data/ddp_tiny.py``; rank 0 writes a checkpoint every few steps), and
the two faults that strike one node of it:

    j = make_job_clone(testbed, workdir, runtime)      # torch mounted in both CTs (``torchsite``) first
    j.run(*JOB_ACTIONS["restart"], timeout=120)
    node_fault(testbed, "node-freeze", seconds)        # CT 201 frozen (lxc-freeze) for that long
    node_fault(testbed, "node-cut", seconds)           # CT 201's link down: SSH and the job's own traffic
    job_rows_agree("J", registry_id, rows, before, after)   # probes by vmid

A project of its own, so the other clones' single-CT launches never stop a node of it (that is refused: see
``launch/spare_jobs``, tested on its own).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from . import faults
from .chaos_checks import ENDED
from .chaos_clones import CONFIG, ROOT, Clone, orch_script

DDP = Path(__file__).parent.parent / "data" / "ddp_tiny.py"
JOB_CKPT = "/workspace/jobckpt"  # on CT 200 inside the loop's small workspace: the probe tracks its files
NODES = (200, 201)
FLAGS = ("--target", "n0", "--target", "n1")
JOB_ACTIONS = {"deploy": ["deploy", *FLAGS], "restart": ["restart", *FLAGS, "--clean-checkpoints", "--yes"],
               "stop": ["stop", *FLAGS]}
NODE_FAULTS = ("node-freeze", "node-cut")
NODE = 201  # the node these faults strike: node 1 of the job
JOB_ENV = 'env = { OMP_NUM_THREADS = "1", DDP_STEPS = "100000", DDP_SLEEP = "0.2", DDP_CKPT_EVERY = "10" }'

EXTRA = """
[targets.n0]
kind = "proxmox"
ct = 200
access = "ssh"
user = "root"

[targets.n1]
kind = "proxmox"
ct = 201
access = "ssh"
user = "root"
"""


def make_job_clone(testbed, workdir: Path, runtime: Path) -> Clone:
    """Clone J of project ``chaosjob``: both CTs straight over SSH, its own registry, the clones' keeper."""
    path = workdir / "clone-J"
    path.mkdir(parents=True)
    shutil.copy(DDP, path / DDP.name)
    known = path / "known_hosts"
    known.write_text(Path(testbed.known_hosts_path).read_text())
    text = CONFIG.format(target="n0", steps=0, root=ROOT, ckpt=JOB_CKPT, api=testbed.api, node=testbed.node,
                         known_hosts=known, trusted=path / "trusted_hosts", key=testbed.key_path, proxy_port=0)
    env_line = text[text.index("env = {"):text.index("\n", text.index("env = {"))]
    for old, new in (('name = "chaos"', 'name = "chaosjob"'), ('sources = ["train.py"]', f'sources = ["{DDP.name}"]'),
                     ('command = "python3 train.py"', f'command = "python3 {DDP.name}"'), (env_line, JOB_ENV)):
        text = text.replace(old, new, 1)
    text = text[:text.index("[targets.ct200]")] + EXTRA
    (path / "orch.toml").write_text(text)
    env = {"ORCH_PROXMOX_TOKEN": testbed.api.token_secret, "ORCH_SSH__READ_TIMEOUT": "5",
           "XDG_RUNTIME_DIR": str(runtime), "ORCH_WARM": "0"}
    return Clone("J", path, env, orch_script())


def node_fault(testbed, fault: str, seconds: float) -> None:
    """Strike node 1 of the job for ``seconds``, then undo it (``heal`` undoes it too, should this be cut short)."""
    if fault == "node-freeze":
        ct = testbed.ct(NODE)
        ct.freeze()
        try:
            time.sleep(seconds)
        finally:
            ct.thaw()
    elif fault == "node-cut":
        faults.link_down(NODE)
        try:
            time.sleep(seconds)
        finally:
            faults.link_up(NODE)


def heal(testbed) -> None:
    ct = testbed.ct(NODE)
    if ct.state() == "FROZEN":
        ct.thaw()
    faults.link_up(NODE)


def job_rows_agree(clone: str, registry_id: str | None, rows: list, before: dict, after: dict) -> list[str]:
    """The job clone's rows against both nodes (``before``/``after``: vmid -> probe): no row ``launching``; a
    ``running`` row has a live node; an ended row, and each ended node record, has no live run; every run of the
    registry live on a node through the status calls is a ``running`` row."""
    problems = []
    if registry_id is None:
        return problems

    def states(probe: dict, key: str) -> list[str]:
        return [probe[vmid]["runs"].get(key, {}).get("state", "absent") for vmid in NODES]

    for row in rows:
        key = f"{registry_id}-{row.id}"
        was, now = states(before, key), states(after, key)
        if row.status == "launching":
            problems.append(f"clone {clone} job {row.id} is launching (nodes: {now})")
        elif row.status == "running" and "live" not in was + now:
            problems.append(f"clone {clone} job {row.id} is running, the nodes say {now}")
        elif row.status in ENDED + ("failed",) and "live" in now:
            problems.append(f"clone {clone} job {row.id} is {row.status}, a node's run is live ({now})")
        elif row.status in ENDED and all(s in ("absent", "failed") for s in now):
            problems.append(f"clone {clone} job {row.id} is {row.status}, no node ever ran it ({now})")
        for rec, state in zip(row.nodes or [], now):
            if rec.get("state") in ENDED + ("failed",) and state == "live":
                problems.append(f"clone {clone} job {row.id} node {rec.get('rank')} is {rec.get('state')}, "
                                "its run is live")
    for vmid in NODES:
        for key, run in after[vmid]["runs"].items():
            if key.startswith(registry_id + "-") and run["state"] == "live" and \
                    before[vmid]["runs"].get(key, {}).get("state") == "live":
                row = next((r for r in rows if f"{registry_id}-{r.id}" == key), None)
                if row is None or row.status != "running":
                    problems.append(f"run {key} is live on CT {vmid}, clone {clone} says "
                                    f"{row.status if row else 'nothing'}")
    return problems
