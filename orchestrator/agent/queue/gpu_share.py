"""Runs side by side on disjoint GPUs: which of the machine's GPUs each live orch run was given.

A GPU is taken when a live run of any project under this root was given it (its recorded
``CUDA_VISIBLE_DEVICES``, in ``launch.json``) or when nvidia-smi shows a compute process on it. The
machine's GPUs are the configured count (``[targets.X] gpus = N``, indices 0..N-1), which wins, else the
ones nvidia-smi reports.

    table(layout, total=2) -> {"gpus": [{"index": 0, "uuid": None, "holder": {"id": 3, ...}, "busy": None}, ...],
                               "error": None, "smi_failed": None}   (nvidia-smi's message when it failed)
    pick(rows, 1) -> [{"index": 1, "uuid": None}]   (None: fewer than 1 free)
    check(layout, "1")  raises a conflict when GPU 1 is given to a live run already
"""

from __future__ import annotations

import os

from ..layout import Layout, read_json
from ..protocol import AgentFailure


def _indices(visible: object) -> list[int]:
    """``"0,2"`` -> [0, 2]; what is not a list of GPU numbers (unset, ``""``, UUIDs) names none."""
    out = []
    for part in str(visible or "").split(","):
        part = part.strip()
        if part.isdigit():
            out.append(int(part))
    return out


def given(layout: Layout) -> list[dict]:
    """Every live run under this root that was given GPUs: ``{"id", "registry", "project", "gpus": [0, 1]}``."""
    from ..run.runs import alive_runs

    out = []
    for run in alive_runs(layout):
        launch = read_json(os.path.join(layout.run_dir(run["id"], run.get("registry")), "launch.json"), {}) or {}
        gpus = _indices((launch.get("env") or {}).get("CUDA_VISIBLE_DEVICES"))
        if gpus:
            out.append({"id": run["id"], "registry": run.get("registry"), "project": run.get("project"),
                        "gpus": gpus})
    return out


def table(layout: Layout, total: int | None = None) -> dict:
    """One row per GPU of the machine with who holds it: ``holder`` (a live orch run) or ``busy`` (nvidia-smi)."""
    from ..machine.system import gpu_report

    report = gpu_report(layout)
    seen = {int(g["index"]): g for g in report.get("gpus") or [] if str(g.get("index", "")).isdigit()}
    indices = list(range(total)) if total else sorted(seen)
    holders = {i: run for run in given(layout) for i in run["gpus"]}
    busy: dict[int, str] = {}
    by_uuid = {g.get("uuid"): i for i, g in seen.items()}
    for app in report.get("apps") or []:
        index = by_uuid.get(app.get("gpu_uuid"))
        if index is None:
            continue
        owner = app.get("owner")
        busy.setdefault(index, f"experiment {owner['id']} ({owner.get('project')})" if owner
                        else f"pid {app.get('pid')}, not orch's")
    rows = []
    for i in indices:
        row = {"index": i, "uuid": (seen.get(i) or {}).get("uuid"), "holder": holders.get(i), "busy": busy.get(i)}
        if report.get("apps_error") and i in seen:
            row["busy"] = f"unknown: {report['apps_error']}"
        rows.append(row)
    error = None if indices else (report.get("error") or "nvidia-smi reports no GPU")
    # nvidia-smi is there and failed (not missing): which GPUs are free is unknown until it answers again
    failed = report.get("error") if report.get("exit_code") is not None and not indices else \
        report.get("apps_error") if any(r["busy"] and r["busy"].startswith("unknown:") for r in rows) else None
    return {"gpus": rows, "error": error, "smi_failed": failed}


def pick(rows: list[dict], n: int) -> list[dict] | None:
    """The first ``n`` free GPUs (no holder, not busy), or None when fewer are free."""
    free = [{"index": r["index"], "uuid": r.get("uuid")} for r in rows if not r.get("holder") and not r.get("busy")]
    return free[:n] if len(free) >= n else None


def share(layout: Layout, total: int | None = None, n: int | None = None) -> dict:
    """``table`` and, with ``n``, the GPUs a new run beside the live ones would get (None: not that many free)."""
    found = table(layout, total)
    return found | {"picked": pick(found["gpus"], n) if n else None}


def check(layout: Layout, visible: str) -> None:
    """Under the target's lock, before a run starts beside others: none of its GPUs is given to a live run."""
    wanted = set(_indices(visible))
    if not wanted:
        raise AgentFailure("input", "a run beside others needs its GPUs (CUDA_VISIBLE_DEVICES)",
                           "deploy it with --gpus N --beside")
    for run in given(layout):
        clash = sorted(wanted & set(run["gpus"]))
        if clash:
            raise AgentFailure("conflict", f"GPU {','.join(map(str, clash))} is taken by experiment {run['id']} "
                               f"({run['project']}) since this launch looked; nothing was changed",
                               f"deploy again (another GPU may be free), or orch stop -e {run['id']}")


def environment(env: dict, gpus: list[dict]) -> dict:
    """The run's env with exactly ``gpus`` visible, numbered as nvidia-smi numbers them (PCI bus order)."""
    return {**env, "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": ",".join(str(g["index"]) for g in gpus)}
