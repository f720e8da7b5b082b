"""The model-based test's invariants, as pure functions over what it saw (``chaos_probe`` and ``model_probe``
answers, the CLI's ``--json``, and what the model knows of each launch); each returns what differed.

    lineage(runs, parents)               a run resumes only from its own lineage's checkpoints
    holds_a_run(before, after, ...)      the target holds a run of the project unless the user stopped it
    environments(runs, launched)         each run's environment is its launch's
    records(listed, status, probe, ...)  orch's records (experiments list, status --json) match the target
    no_secret(found)                     no secret at rest on the target
"""

from __future__ import annotations

import os

# what the test's script prints of its environment at each start (``model.TRAIN``)
WATCHED = ("ORCH_EXPERIMENT_ID", "ORCH_CHECKPOINT_DIR", "CUDA_VISIBLE_DEVICES", "MODEL_TAG", "shell_tag",
           "LEAK_VAR")


def _number(key: str) -> int:
    return int(key.rsplit("-", 1)[1])


def live_ids(probe: dict, registry_id: str | None) -> set[int]:
    """This registry's runs that the target says are live."""
    return {_number(k) for k, r in probe["runs"].items()
            if r["state"] == "live" and registry_id and k.startswith(registry_id + "-")}


def ancestors(exp_id: int, parents: dict[int, int | None]) -> set[int]:
    seen: set[int] = set()
    while exp_id in parents and parents[exp_id] is not None and parents[exp_id] not in seen:
        exp_id = parents[exp_id]  # type: ignore[assignment]
        seen.add(exp_id)
    return seen


def lineage(runs: dict, parents: dict[int, int | None]) -> list[str]:
    """A start that resumed from a checkpoint resumed from one written by the run itself (an earlier start or
    attempt), by an ancestor (the registry's parent chain: restart, rollback), or by a run that was given the same
    checkpoint folder (the project's main line, one --beside run's own); never another lineage's."""
    folder_of = {_number(k): r["env"].get("ORCH_CHECKPOINT_DIR") for k, r in runs.items()}
    problems = []
    for key, run in sorted(runs.items()):
        me = _number(key)
        for start in run["starts"]:
            writer, resumed = start.get("writer"), start.get("resumed")
            if not resumed:
                continue
            whose = "written by"
            if writer is None:  # not a checkpoint file the script wrote (a folder orch named): whose folder is it?
                writer, whose = _owner(resumed, folder_of, me), "in the checkpoint folder of"
                if writer is None:
                    continue
            writer = int(writer)
            if writer == me or writer in ancestors(me, parents):
                continue
            if folder_of.get(writer) and folder_of.get(writer) == folder_of.get(me):
                continue
            problems.append(f"experiment {me} (checkpoints {folder_of.get(me)}) resumed from {resumed}, {whose} "
                            f"experiment {writer} (checkpoints {folder_of.get(writer)}), which is not of its lineage")
    return problems


def _owner(path: str, folder_of: dict[int, str | None], me: int) -> int | None:
    """The run whose checkpoint folder holds ``path`` most narrowly, when that folder is not ``me``'s own."""
    mine = folder_of.get(me) or ""
    found = [(len(f), e) for e, f in folder_of.items() if f and (path == f or path.startswith(f.rstrip("/") + "/"))
             and len(f) > len(mine)]
    return max(found)[1] if found else None


def holds_a_run(before: set[int], after: set[int], stopped_by_user: bool, queued: bool,
                exempt: set[int] = frozenset()) -> list[str]:
    """A project that had a live run still has one after a step that was not a stop (a failed, refused or
    interrupted launch leaves the old run, or its replacement, running; a container's restart resumes it), and
    after a stop when something was queued behind it. ``exempt`` runs may end without that: those given a budget
    (a sweep's ``--steps``) and, across a container's restart, those with secrets (never stored on the target, a
    run with secrets is not resumed after a reboot)."""
    before = before - exempt
    if not before or after:
        return []
    if stopped_by_user and not queued:
        return []
    return [f"the target held experiment(s) {sorted(before)} of the project before the step and none after it"
            + (" (its queue had more)" if stopped_by_user else "")]


def environments(runs: dict, launched: dict[int, dict]) -> list[str]:
    """Each start of a run saw its launch's environment: the values its ``launch.json`` records (its id, its
    checkpoint folder, its GPUs), the ``MODEL_TAG`` and ``shell_tag`` its launch was given (when the test knows
    them: ``launched``), and nothing of the launching shell's own variables (``LEAK_VAR``)."""
    problems = []
    for key, run in sorted(runs.items()):
        me = _number(key)
        want = {k: run["env"].get(k) for k in WATCHED if k != "LEAK_VAR"}
        want.update({k: v for k, v in (launched.get(me) or {}).items() if k in WATCHED})
        for n, start in enumerate(run["starts"], 1):
            saw = start.get("env") or {}
            wrong = {k: (saw.get(k), v) for k, v in want.items() if saw.get(k) != v}
            if saw.get("LEAK_VAR") is not None:
                wrong["LEAK_VAR"] = (saw["LEAK_VAR"], None)
            if wrong:
                shown = ", ".join(f"{k}={got!r} (its launch: {exp!r})" for k, (got, exp) in sorted(wrong.items()))
                problems.append(f"experiment {me}'s start {n} saw {shown}")
    return problems


def records(listed: list[dict], status: dict | None, before: dict, after: dict, registry_id: str | None) \
        -> list[str]:
    """``orch experiments list --json`` and ``status --json``, called between the probes ``before`` and ``after``:
    no row launching; a row running whose run had already ended before the calls (a run may end during them:
    the next step judges it); a row ended whose run was live all along; a live run's row not running; status's
    live runs not the target's."""
    problems = []
    rows = {r["id"]: r for r in listed}
    was, now = live_ids(before, registry_id), live_ids(after, registry_id)
    over = {_number(k) for k, r in before["runs"].items()
            if r["state"] in ("ended", "dead", "failed") and registry_id and k.startswith(registry_id + "-")}
    for exp_id, row in sorted(rows.items()):
        state = row.get("status")
        if state == "launching":
            problems.append(f"experiment {exp_id} is still launching in the registry")
        elif state == "running" and exp_id in over and exp_id not in now:
            problems.append(f"experiment {exp_id} is running in the registry, its run on the target had ended")
        elif state in ("finished", "crashed", "stopped", "lost", "failed") and exp_id in was & now:
            problems.append(f"experiment {exp_id} is {state} in the registry and live on the target")
    for exp_id in sorted(was & now):
        if rows.get(exp_id, {}).get("status") != "running":
            problems.append(f"experiment {exp_id} is live on the target, the registry says "
                            f"{rows.get(exp_id, {}).get('status', 'nothing')}")
    if status is not None:
        shown = {r["experiment"] for r in status.get("live") or []} or \
            ({status["experiment"]} if status.get("state") == "running" else set())
        if (shown & over) - now or (was & now) - shown:
            problems.append(f"orch status --json shows live {sorted(shown)}, the target {sorted(was & now)} "
                            f"(ended before: {sorted((shown & over) - now)})")
    return problems


def no_secret(found: list[str]) -> list[str]:
    return [f"the secret's value is at rest on the target in {path}" for path in found]


def kept(seen: dict[str, str], files: dict[str, str]) -> list[str]:
    """Every checkpoint file ever written is still there, byte for byte, in its folder or a trash entry (no
    purge was confirmed)."""
    present = {(os.path.basename(p), sha) for p, sha in files.items()}
    return [f"checkpoint {path} is gone from its folder and every trash entry"
            for path, sha in sorted(seen.items()) if (os.path.basename(path), sha) not in present]
