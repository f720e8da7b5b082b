"""``orch experiments rebuild``: a new registry made from what the targets hold, the unreadable one kept aside.

Each run folder on a target (``<root>/runs/<registry id>-<id>``) keeps the experiment's record
(``experiment.json``) and how it went (``exit.json``, the supervisor's pid file, ``stop_requested``): the agent's
``run_records`` reads them all for this project, and the rows are made from them with their state now. The
registry's id comes from the damaged file when it can still be read, else from the runs this clone started.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

from ..reach.agent_client import AgentClient
from ..config import Settings
from ..errors import InputError, OrchError, RegistryCorrupt
from .experiments import Experiment, Registry, clone, salvage
from ..reach.targets import Target

RECORD_FIELDS = set(Experiment.model_fields) - {"id", "status", "exit_code", "ended", "config"}


def _sources(settings: Settings, resolve: Callable[[str | None, int | None], Target],
             known: list[str], notice: Callable[[str], None]) -> tuple[list[Target], list[str]]:
    """Every target the project names (orch.toml, the current target, the damaged file's), one per machine."""
    from ..reach import current

    wanted: list[tuple[str | None, int | None]] = [(n, None) for n, t in settings.targets.items() if t.kind != "group"]
    chosen = current.load(settings.state_dir) or {}
    for entry in [chosen, *(chosen.get("nodes") or [])]:
        if entry.get("ct") is not None:
            wanted.append((None, int(entry["ct"])))
    for name in known:
        if name.startswith("ct") and name[2:].isdigit() and name not in settings.targets:
            wanted.append((None, int(name[2:])))
    found, machines, missed = [], set(), []
    for name, ct in dict.fromkeys(wanted):
        what = name or f"CT {ct}"
        try:
            tgt = resolve(name, ct)
        except OrchError as exc:
            missed.append(what)
            notice(f"orch: could not ask {what}: {exc.message}")
            continue
        if tgt.machine not in machines:
            machines.add(tgt.machine)
            found.append(tgt)
    return found, missed


def _records(settings: Settings, tgt: Target) -> list[dict]:
    assert tgt.connect is not None
    transport = tgt.connect()
    try:
        client = AgentClient(transport, tgt.root, tgt.python, timeout=settings.ssh.command_timeout)
        runs = client.one("run_records", project=settings.project.name)["runs"]
    finally:
        transport.close()
    return [dict(run, target=tgt) for run in runs]


def _registry_id(runs: list[dict], given: str | None, clone: dict) -> str | None:
    if given:
        return given
    ids = {r["state"].get("registry") for r in runs} - {None}
    mine = {r["state"].get("registry") for r in runs if r["experiment"].get("clone") == clone} - {None}
    if len(mine) == 1:
        return mine.pop()
    if len(ids) <= 1:
        return ids.pop() if ids else None
    seen = sorted({(r["state"]["registry"], str((r["experiment"].get("clone") or {}).get("path")))
                   for r in runs if r["state"].get("registry")})
    raise InputError("the targets hold runs of several clones of this project: "
                     + ", ".join(f"registry {i} ({path})" for i, path in seen),
                     hint="name this clone's with orch experiments rebuild --registry ID")


def _row(run: dict) -> dict:
    exp, state, tgt = run["experiment"], run["state"], run["target"]
    fields = {k: v for k, v in exp.items() if k in RECORD_FIELDS and v is not None}
    fields.update(id=int(state["id"]), project=exp.get("project") or state.get("project"),
                  status=state.get("state") or "lost", exit_code=state.get("exit_code"), ended=state.get("ended"))
    fields.setdefault("target", tgt.name)
    fields.setdefault("machine", tgt.machine)
    fields.setdefault("revision", "unknown")
    fields.setdefault("command", [])
    fields.setdefault("created", state.get("started") or time.time())
    if state.get("started") is not None:
        fields["started"] = state["started"]
    if exp.get("secrets"):
        fields["config"] = {"project": {"secrets": exp["secrets"]}}
    if fields["status"] == "failed" and state.get("error"):
        fields["error"] = str(state["error"])[:2000]
    return fields


def rebuild(settings: Settings, resolve: Callable[[str | None, int | None], Target], *,
            registry_id: str | None = None, notice: Callable[[str], None]) -> dict:
    """Replace an unreadable (or missing) registry with one made from the targets' run folders."""

    path = settings.state_dir / "experiments.db"
    if path.exists():
        try:
            Registry(path, notice=notice).close()
        except RegistryCorrupt:
            pass
        else:
            raise InputError(f"the experiment registry {path} is readable: there is nothing to rebuild",
                             hint="rebuild replaces a corrupt registry; orch status brings a readable one up to "
                                  "date from the targets")
    old = salvage(path) if path.exists() else {}
    targets, missed = _sources(settings, resolve, old.get("targets", []), notice)
    runs = []
    for tgt in targets:
        try:
            runs += _records(settings, tgt)
        except OrchError as exc:
            missed.append(tgt.label)
            notice(f"orch: could not ask {tgt.label}: {exc.message}")
    me = clone(settings)
    rid = _registry_id(runs, registry_id or old.get("registry_id"), me)
    rows: dict[int, dict] = {}
    plain: list[int] = []  # runs/<n> folders from before registry keys: this clone's, numbered below keyed_from
    for run in runs:
        key = run["state"].get("registry")
        if key != rid and (key is not None or run["experiment"].get("clone") not in (None, me)):
            continue  # another clone's run
        exp_id = int(run["state"]["id"])
        if exp_id not in rows:
            rows[exp_id] = _row(run)
            if key is None:
                plain.append(exp_id)
    keyed_from = max(plain) + 1 if plain else 1
    tmp = path.with_name(f".{path.name}.rebuild-{os.getpid()}")
    for leftover in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
        leftover.unlink(missing_ok=True)
    Registry.write_new(tmp, rid or os.urandom(6).hex(), keyed_from, [rows[i] for i in sorted(rows)])
    aside = None
    if path.exists():
        aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
        for suffix in ("", "-wal", "-shm"):  # the damaged file with what SQLite kept beside it
            if Path(f"{path}{suffix}").exists():
                os.replace(f"{path}{suffix}", f"{aside}{suffix}")
    os.replace(tmp, path)
    return {"path": str(path), "registry": rid, "experiments": sorted(rows), "asked": [t.label for t in targets],
            "missed": missed, "kept_aside": str(aside) if aside else None}

