"""Which GPUs a machine has and who uses them: a CT config's passthrough lines and what nvidia-smi reports.

Two sources, one row per GPU:

- the CT config (``devN: /dev/nvidiaK[,gid=…]``, ``lxc.mount.entry``, ``lxc.cgroup2.devices.allow``), read
  with ``proxmox.config_summary``: what is passed through, known even while the CT is stopped;
- the agent's ``gpus`` call (``agent/machine/system.gpu_report``): nvidia-smi's GPUs and compute processes, each
  process with the orch run it belongs to (its recorded pid or an ancestor of it).

``survey`` asks many machines at once, each in its own thread: one that does not answer costs only its
own timeout and is reported as such.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any, Callable, Mapping

from .proxmox import GPU_DEVICE_PREFIXES, config_summary, gpu_count, parse_prop_string

NVIDIA_DEVICE = re.compile(r"/dev/nvidia(\d+)")


def passthrough(config: Mapping[str, Any] | None = None, summary: Mapping[str, Any] | None = None) -> dict:
    """What a CT config passes through: ``{"count", "indices", "lines"}`` (``count`` None: some, unknown).

    ``lines`` are the config's GPU lines as written (``dev0: /dev/nvidia0,gid=44``,
    ``lxc.cgroup2.devices.allow: c 195:* rwm``, …); ``indices`` the ``/dev/nvidiaK`` numbers named.
    """
    summary = summary if summary is not None else config_summary(config or {})
    found = list(summary.get("gpus") or [])
    lines = []
    for key, value in (summary.get("devices") or {}).items():
        if parse_prop_string(value, "path").get("path", "").startswith(GPU_DEVICE_PREFIXES):
            lines.append(f"{key}: {value}")
    for key, value in (summary.get("mounts") or {}).items():
        if parse_prop_string(value, "volume").get("volume", "").startswith(GPU_DEVICE_PREFIXES):
            lines.append(f"{key}: {value}")
    lines += [line for line in summary.get("lxc") or [] if line in found
              or line.partition(": ")[2].split(" ")[0] in found]
    indices = sorted({int(m[1]) for g in found if (m := NVIDIA_DEVICE.fullmatch(g))})
    return {"count": gpu_count(found), "indices": indices, "lines": lines}


def holder_text(holders: list[dict]) -> str:
    """``free``, ``exp 14 (tinylm)``, ``busy: pid 4411, not orch's`` (several: joined by ``; ``)."""
    if not holders:
        return "free"
    out = []
    for app in holders:
        owner = app.get("owner")
        if owner:
            out.append(f"exp {owner['id']} ({owner.get('project') or '?'})")
        else:
            out.append(f"busy: pid {app.get('pid')}, not orch's")
    return "; ".join(dict.fromkeys(out))


INTS = ("index", "util", "mem_used_mib", "mem_total_mib", "temperature_c", "pid")
FLOATS = ("power_w", "power_limit_w")


def _numbers(row: dict) -> dict:
    """nvidia-smi's numbers (strings in its csv) as numbers; what it cannot report stays None."""
    out = dict(row)
    for key, kind in [(k, int) for k in INTS] + [(k, float) for k in FLOATS]:
        if out.get(key) is not None:
            try:
                out[key] = kind(float(out[key])) if kind is int else kind(out[key])
            except ValueError:
                out[key] = None
    return out


def gpus_of(report: dict) -> list[dict]:
    """The agent's report as one row per GPU, each with ``holders`` (its compute processes) and ``use``."""
    rows = []
    apps = [_numbers(a) for a in report.get("apps") or []]
    for gpu in report.get("gpus") or []:
        holders = [a for a in apps if a.get("gpu_uuid") == gpu.get("uuid")]
        row = _numbers(gpu)
        row.update(holders=holders, use=holder_text(holders), free=not holders)
        if report.get("apps_error"):
            row.update(use=f"unknown: {report['apps_error']}", free=False)
        rows.append(row)
    return rows


def ask(settings, target, timeout: float | None = None) -> dict:
    """One machine's GPUs over the agent: ``{"gpus": [...], "error", "driver_version"}``."""
    from .agent_client import AgentClient

    assert target.connect is not None
    transport = target.connect()
    try:
        client = AgentClient(transport, target.root, target.python,
                             timeout=timeout or settings.ssh.read_timeout, timeout_setting="[ssh] read_timeout")
        if target.spec.gpus:  # [targets.X] gpus = N: the machine's count, whatever nvidia-smi sees
            return configured(client.one("gpu_share", total=target.spec.gpus))
        report = client.one("gpus")
    finally:
        transport.close()
    return {"gpus": gpus_of(report), "error": report.get("error"), "exit_code": report.get("exit_code"),
            "driver_version": report.get("driver_version")}


def configured(share: dict) -> dict:
    """The agent's ``gpu_share`` table (a configured count) as ``ask`` answers: a GPU given to a live orch run is
    held by it, one nvidia-smi shows busy by what it says."""
    rows = []
    for row in share.get("gpus") or []:
        held = row.get("holder")
        holders = [{"owner": held, "pid": None}] if held else []
        use = holder_text(holders) if held else row.get("busy") or "free"
        rows.append({"index": row["index"], "uuid": row.get("uuid"), "holders": holders, "use": use,
                     "free": not held and not row.get("busy")})
    return {"gpus": rows, "error": share.get("error"), "exit_code": None, "driver_version": None}


def survey(jobs: list[tuple[Any, Callable[[], dict]]], timeout: float) -> dict[Any, dict]:
    """Run each ``(key, ask)`` in its own thread; after ``timeout`` s a machine still asking is
    ``{"error": "no answer within N s", "timed_out": True}``. Errors come back as ``{"error": message}``."""
    from ..errors import OrchError

    results: dict[Any, dict] = {}
    lock = threading.Lock()

    def one(key: Any, func: Callable[[], dict]) -> None:
        try:
            got = func()
        except OrchError as exc:
            got = {"error": exc.message, "hint": exc.hint}
        except Exception as exc:  # noqa: BLE001 - one machine's failure must not hide the others
            got = {"error": f"{type(exc).__name__}: {exc}"}
        with lock:
            results.setdefault(key, got)

    threads = [threading.Thread(target=one, args=job, daemon=True, name=f"gpus-{job[0]}") for job in jobs]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    with lock:
        for key, _ in jobs:
            results.setdefault(key, {"error": f"no answer within {timeout:g} s", "timed_out": True})
        return dict(results)


def survey_timeout(settings) -> float:
    """What one machine may take: its connection, then one read-only agent call."""
    return (settings.ssh.connect_timeout or 10.0) + settings.ssh.read_timeout


def machines(settings, resolve: Callable[[str | None, int | None], Any], names: list[str] | None = None,
             cts: list[int] | None = None) -> list[dict]:
    """Every GPU machine orch can see, asked in parallel: each CT the Proxmox token sees (``cts`` narrows
    them), else (or with ``names``) each configured target. ``resolve(name, ct)`` gives a reachable Target.

    A stopped CT shows its passthrough config only; a machine that fails or does not answer has ``error``.
    """
    rows: list[dict] = []
    if settings.proxmox is not None and not names:
        from . import proxmox
        from .targets import proxmox_client

        for ct in proxmox.list_cts(proxmox_client(settings.proxmox), summaries=True):
            if cts and ct["ct"] not in cts:
                continue
            rows.append({"where": f"CT {ct['ct']} ({ct['name']})", "ct": ct["ct"], "target": None,
                         "node": ct["node"], "status": ct["status"], "error": ct.get("error"),
                         "passthrough": passthrough(summary=ct.get("config_summary") or {}), "gpus": []})
        seen = {r["ct"] for r in rows}
        rows += [{"where": f"CT {ct}", "ct": ct, "target": None, "node": None, "status": None, "passthrough": None,
                  "error": f"the token {settings.proxmox.token_id} does not see CT {ct}", "gpus": []}
                 for ct in cts or [] if ct not in seen]
    else:
        chosen = names or [n for n, t in settings.targets.items() if t.kind != "group"]
        for name in chosen:
            spec = settings.targets.get(name)
            where = name if spec is None or spec.kind != "proxmox" else f"{name} (CT {spec.ct})"
            rows.append({"where": where, "ct": None, "target": name, "node": None, "status": None, "error": None,
                         "passthrough": None, "gpus": []})
    jobs = [(i, _asker(settings, resolve, row)) for i, row in enumerate(rows)
            if row["error"] is None and row["status"] in (None, "running")]
    answers = survey(jobs, survey_timeout(settings))
    for i, got in answers.items():
        row = rows[i]
        row.update(gpus=got.get("gpus") or [], driver_version=got.get("driver_version"))
        if got.get("error") and not got.get("gpus"):
            row["error"] = got["error"]
            row["timed_out"] = bool(got.get("timed_out"))
        if got.get("passthrough") and row["passthrough"] is None:
            row["passthrough"] = got["passthrough"]
    return rows


def _asker(settings, resolve, row: dict) -> Callable[[], dict]:
    def go() -> dict:
        target = resolve(row["target"], row["ct"])
        got = ask(settings, target)
        summary = (target.info or {}).get("ct_config")
        if summary:
            got["passthrough"] = passthrough(summary=summary)
        return got
    return go
