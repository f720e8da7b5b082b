"""The chaos test's invariants, as pure functions over what the loop saw: each returns the list of what differed.

``probe`` dicts come from ``chaos_probe.py`` (the target's own files, read under its lock); rows from each
clone's registry. ``before``/``after`` are probes taken just before and just after the cycle's ``orch status``
calls, so a run that ends on its own between them is never counted against the record.
"""

from __future__ import annotations

import os

from .chaos_clones import Outcome

ENDED = ("finished", "crashed", "stopped", "lost")


def rows_agree(clone: str, registry_id: str | None, rows: list, before: dict, after: dict) -> list[str]:
    """No row ``launching``; every row's state is the target's; every live run on the target is a ``running`` row."""
    problems = []
    ids = set()
    for row in rows:
        key = f"{registry_id}-{row.id}"
        ids.add(key)
        was = before["runs"].get(key, {}).get("state", "absent")
        now = after["runs"].get(key, {})
        state = now.get("state", "absent")
        if row.status == "launching":
            problems.append(f"clone {clone} row {row.id} is launching (target: {state})")
        elif row.status == "running" and "live" not in (was, state):
            problems.append(f"clone {clone} row {row.id} is running, the target says {state}")
        elif row.status in ENDED + ("failed",) and state == "live":
            problems.append(f"clone {clone} row {row.id} is {row.status}, the target's run is live")
        elif row.status in ENDED and state in ("absent", "failed"):
            problems.append(f"clone {clone} row {row.id} is {row.status}, the target never ran it ({state})")
        elif row.status == "failed" and state in ("ended", "dead"):
            problems.append(f"clone {clone} row {row.id} is failed, the target's run ran and is over ({state})")
        elif row.status in ("finished", "crashed") and state == "ended" and now.get("exit_code") != row.exit_code:
            problems.append(f"clone {clone} row {row.id} has exit code {row.exit_code}, "
                            f"the target's exit.json {now.get('exit_code')}")
    if registry_id is None:
        return problems
    for key, run in after["runs"].items():
        if key.startswith(registry_id + "-") and run["state"] == "live" and \
                before["runs"].get(key, {}).get("state") == "live":
            row = next((r for r in rows if f"{registry_id}-{r.id}" == key), None)
            if row is None or row.status != "running":
                problems.append(f"run {key} is live on the target, clone {clone} says "
                                f"{row.status if row else 'nothing'}")
    return problems


def checkpoint_folder_files(probe: dict) -> dict[str, str]:
    """path -> sha256 of the checkpoints in the folder itself (not in a trash entry, not hidden)."""
    return {p: sha for p, sha in probe["files"].items()
            if "trash" not in p and not os.path.basename(p).startswith(".")}


def checkpoints_kept(seen: dict[str, str], after: dict) -> list[str]:
    """Every checkpoint ever seen (path -> sha256) is still there, byte for byte, in the folder or a trash entry."""
    present = {(os.path.basename(p), sha) for p, sha in after["files"].items()}
    return [f"checkpoint {path} (sha256 {sha[:12]}) is gone from the folder and every trash entry"
            for path, sha in sorted(seen.items()) if (os.path.basename(path), sha) not in present]


def target_tidy(before: dict, after: dict) -> list[str]:
    """No half revision; no ``.tmp-*`` of orch's own that outlived the cycle's status calls."""
    problems = [f"revision {rev} is half made: {why}" for rev, why in sorted(after["bad_revisions"].items())]
    stale = sorted(set(before["tmp"]) & set(after["tmp"]))
    problems += [f"orphan temporary file {path}" for path in stale]
    return problems


def clean_output(outcome: Outcome, timeout: float) -> list[str]:
    """Every error is one ``error:`` line and a ``hint:``, never a traceback; nothing outlives its timeout."""
    what = f"clone {outcome.clone} `orch {' '.join(outcome.argv)}`"
    if outcome.hung:
        return [f"{what} hung past its {timeout:g} s timeout"]
    if outcome.signalled == "SIGKILL" and outcome.returncode == -9:
        return []
    lines = outcome.stderr.splitlines()
    if outcome.signalled == "SIGINT" and _python_starting(outcome):
        return []  # a Ctrl-C before orch's first line ran: nothing was done, and nothing could say so
    if "Traceback (most recent call last)" in outcome.stderr:
        return [f"{what} printed a traceback (exit {outcome.returncode}): {_tail(outcome.stderr)}"]
    if outcome.returncode == 0:
        return []
    if outcome.signalled == "SIGINT" and outcome.returncode == 130:
        if any(line.startswith("interrupted") for line in lines):
            return []
        return [f"{what} exited 130 after SIGINT without saying what was done: {_tail(outcome.stderr)}"]
    errors = [line for line in lines if line.startswith("error: ")]
    hints = [line for line in lines if line.startswith("hint: ")]
    if len(errors) != 1 or not hints or outcome.returncode < 0:
        return [f"{what} failed (exit {outcome.returncode}) without one error: line and a hint: "
                f"{_tail(outcome.stderr)} [stdout: {_tail(outcome.stdout, 1)}]"]
    return []


def succeeded(outcomes: list[Outcome], when: str) -> list[str]:
    """Commands that must work even ``when`` (a remedy on a full disk): exit 0."""
    return [f"clone {o.clone} `orch {' '.join(o.argv)}` {when} exited {o.returncode}: {_tail(o.stderr)}"
            for o in outcomes if o.returncode != 0]


def names_holder(outcome: Outcome, pid: int | None) -> list[str]:
    """A command that failed while another process held its registry says which process (its pid)."""
    if outcome.returncode in (0, None) or outcome.signalled or pid is None:
        return []
    errors = [line for line in outcome.stderr.splitlines() if line.startswith("error: ")]
    if any(f"pid {pid}" in line for line in errors):
        return []
    return [f"clone {outcome.clone} `orch {' '.join(outcome.argv)}` failed (exit {outcome.returncode}) on a "
            f"registry held by pid {pid} without naming it: {_tail(outcome.stderr)}"]


def _python_starting(outcome: Outcome) -> bool:
    """Python's own start-up interrupted (the interpreter, ``site``'s ``.pth`` files, the entry script's import):
    killed by the signal without a word, or a ``KeyboardInterrupt`` traceback in which no frame is orch's."""
    lines = outcome.stderr.strip().splitlines()
    if not lines:
        return outcome.returncode == -2  # SIGINT's default action, before Python had its handler
    frames = [line for line in lines if line.lstrip().startswith('File "')]
    return lines[-1] == "KeyboardInterrupt" and not any("/orchestrator/" in line for line in frames)


def _tail(text: str, lines: int = 4) -> str:
    return " | ".join(text.strip().splitlines()[-lines:]) or "(no output)"
