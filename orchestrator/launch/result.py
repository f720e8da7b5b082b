"""What a launch did: its first metric line (``--wait``), or, after an interruption, what the target says.

Both run after the locked apply of ``operations.execute``. ``settle_interrupted`` asks the target under its lock,
so the interrupted agent has finished its step (and started no other) by the time it answers.
"""

from __future__ import annotations

import posixpath
import time
from typing import Any

from ..records import launch_journal
from .. import checkpoints
from ..reach.agent_client import AgentClient, Op, decode_log
from ..records.end_reason import describe
from ..errors import OrchError
from ..records.experiments import ENDED, Experiment, Registry
from .model import Checkpoints, Launch, Outcome, StartRun, StopRun


def wait_first_metric(launch: Launch, client: AgentClient, exp: Experiment, registry: str | None) -> dict:
    """Read the run's log until a metric line (step, loss or throughput), its end, or ``launch.wait`` s."""
    from ..watch.logparse import Parser, plain

    parser = Parser(launch.settings.metrics.patterns or None)
    begin = time.monotonic()
    offset, pending = 0, b""
    while True:
        value = client.one("log_read", exp_id=exp.id, registry=registry, offset=offset, max_bytes=1 << 20)
        data = decode_log(value)
        offset = value["offset"]
        *lines, pending = (pending + data).replace(b"\r", b"\n").split(b"\n")  # a bar's updates end in \r
        for line in lines:
            text = line.decode("utf-8", "replace")
            event = parser.parse_line(text)
            if event and {"step", "loss", "tok_s", "steps_s"} & set(event):
                return {"state": "running", "metric": event, "line": plain(text).strip(),
                        "seconds": round(time.monotonic() - begin, 1)}
        state = value["state"]
        if state.get("state") in ENDED:
            tail = client.one("log_read", exp_id=exp.id, registry=registry, tail_lines=15, max_bytes=64 << 10)
            return {"state": state["state"], "exit_code": state.get("exit_code"), "ended": state.get("ended"),
                    "end_reason": describe(state, registry),
                    "tail": decode_log(tail).decode("utf-8", "replace").rstrip().splitlines(),
                    "seconds": round(time.monotonic() - begin, 1)}
        if time.monotonic() - begin >= launch.wait:
            return {"state": "running", "metric": None, "seconds": launch.wait}
        time.sleep(0.25)


def record_wait(registry: Registry, out: Outcome) -> None:
    waited, exp = out.waited or {}, out.experiment
    if exp is not None and waited.get("state") in ENDED:
        out.experiment = registry.update(exp.id, status=waited["state"], exit_code=waited.get("exit_code"),
                                         ended=waited.get("ended") or time.time(), end_reason=waited.get("end_reason"))


DROPPED = "the connection dropped"  # how a launch whose link failed midway was cut (no Ctrl-C was pressed)


def settle_interrupted(launch: Launch, registry: Registry, probe: dict, exp: Experiment | None, out: Outcome,
              how: str = "interrupted") -> str:
    """After an interrupted apply: ask the target what was done, record it, and say it in one line.

    The call waits for the target's lock, so the interrupted agent has finished its step by then (and, past the
    old run's stop, the new run's start: ``agent.__main__.committed``). ``how`` says what cut it
    ("interrupted", "interrupted by SIGTERM", ``DROPPED``); it goes into the record.
    """
    settings, target = launch.settings, launch.target
    old = [r["id"] for r in probe["alive_runs"]] if launch.has(StopRun) else []
    ids = [*old, *([exp.id] if exp is not None else [])]
    ops = [Op("status", {"project": settings.project.name, "ids": ids, "tail": False, "gpus": False})]
    cleaning = exp is not None and launch.inputs.checkpoint_action != "keep" and launch.has(Checkpoints)
    if cleaning:  # where this launch moved the checkpoints, if it got that far
        ops.append(checkpoints.inventory_op(target))
    if exp is not None:  # what its steps did, as the agent journaled them
        ops.append(Op("journal_read", {"ids": [exp.id], "registry": registry.run_registry(exp.id)}))
    grace = settings.run.stop_timeout + settings.run.term_timeout + settings.run.lock_timeout + 10
    if exp is not None:  # recorded at once: if orch is killed while asking, the row already says why
        out.experiment = registry.update(exp.id, status="failed", ended=time.time(),
                                         error=f"{how}; the target was not yet asked what was done")
    try:
        again = " again" if how.startswith("interrupted") else ""  # a dropped link: no Ctrl-C so far
        launch.echo(f"orch: {how}; asking {target.label} what was done (Ctrl-C{again} to leave now)")
    except OSError:
        pass  # SIGHUP: the terminal is gone, the record still matters
    try:
        assert target.connect is not None
        with target.connect() as transport:
            client = AgentClient(transport, target.root, target.python, timeout=grace + 30)
            values = client.call(ops, lock=grace, what=f"{launch.book.name} (check after interruption)")
    except (OrchError, KeyboardInterrupt) as exc:
        if exp is not None:
            out.experiment = registry.update(exp.id, status="failed", ended=time.time(),
                                             error=f"{how}; the target could not be asked what was done")
        why = exc.message if isinstance(exc, OrchError) else "interrupted again"
        where = ""
        if cleaning:
            trash = (probe.get("ckpt_safe") or {}).get("trash") or "the checkpoint trash"
            where = (f"; if it moved the checkpoints aside they are in an entry of {trash} (orch checkpoints list), "
                     "and orch checkpoints restore ENTRY puts them back")
        if old and exp is not None and launch.has(StartRun):  # the call with the stop and the start was sent
            runs = ", ".join(map(str, old))
            return (f"{target.label} could not be asked what was done ({why}); the stop of old run {runs} and the "
                    f"start of new run {exp.id} were sent: the target finishes the start by itself once the old run "
                    f"stopped, or leaves the old run running if its stop had not begun; orch status shows which "
                    f"once it answers{where}")
        return f"what the target did is unknown ({why}); orch status tells once it answers{where}"
    was_alive = {(r["id"], r.get("registry")) for r in probe["alive_runs"]} if launch.has(StopRun) else set()
    now = time.time()
    gone = [r for r in values[0]["runs"] if (r["id"], r.get("registry")) in was_alive and r["state"] in ENDED]
    for run in gone:
        update_quietly(registry, run, launch, status=run["state"], exit_code=run.get("exit_code"),
                       ended=run.get("ended") or now, end_reason=describe(run, registry.registry_id, now))
    out.stopped = [{"id": r["id"], "mine": registry.owns(r), "clone": r.get("clone"), "state": r["state"],
                    "exit_code": r.get("exit_code"), "signals": []} for r in gone]
    stopped = [r["id"] for r in gone]
    new = next((r for r in values[0]["runs"] if exp is not None and r["id"] == exp.id and registry.owns(r)), None)
    done = []
    if new is not None and exp is not None and new["state"] == "failed":  # its start was tried, and failed
        out.experiment = registry.update(exp.id, status="failed", ended=new.get("ended") or now,
                                         error=f"{how}; its start failed: {new.get('error') or 'no reason given'}")
        done.append(f"new run {exp.id} not started ({new.get('error') or 'its start failed'})")
    elif new is not None and exp is not None:
        state = "running" if new["state"] == "launching" else new["state"]
        fields: dict = {"status": state, "started": new.get("started") or now, "error": None, "ended": None}
        if state in ENDED:
            fields.update(exit_code=new.get("exit_code"), ended=new.get("ended") or now)
        out.experiment = registry.update(exp.id, **fields)
        done.append(f"new run {exp.id} started ({new['state']})")
    elif exp is not None:
        out.experiment = registry.update(exp.id, status="failed", ended=now, error=f"{how} before it started")
    if stopped:
        done.append(f"old run {', '.join(map(str, stopped))} stopped")
    moved = _moved_entry(values, exp, cleaning)
    if moved is not None and exp is not None:
        done.append(_moved(launch, registry, exp, out, moved, put_back=new is None or new["state"] == "failed"))
    elif exp is not None:  # it moved nothing: say so (kept) where the journal or the launch itself tells
        told = launch_journal.facts(values[-1].get(str(exp.id), []))
        fields = launch_journal.checkpoint_fields(told) if cleaning else {"checkpoints_action": "kept"}
        if fields:
            out.experiment = registry.update(exp.id, **fields)
    if not done:
        done.append("nothing was changed on the target")
    if new is None and exp is not None:
        done.append(f"new run {exp.id} not started")
    started = new is not None and new["state"] != "failed"
    if (back := go_back(out.stopped, started)):
        done.append(back)
    return "; ".join(done)


def _moved_entry(values: list, exp: Experiment | None, cleaning: bool) -> dict | None:
    """The trash entry this launch made: from its journal, else the one of the trash that names it as mover."""
    if exp is None or not cleaning:
        return None
    told = launch_journal.facts(values[-1].get(str(exp.id), []))
    trash = told["trash"] or {}
    if told["known"] and trash.get("action") == "moved" and trash.get("entry_path"):
        return {"name": trash["entry"], "trash": posixpath.dirname(trash["entry_path"])}
    if told["known"] and told["trash"] is not None:
        return None  # its trash step ran and moved nothing (or purged): nothing to record as moved
    return next((e for e in values[1]["entries"] if e.get("moved_by") == exp.id), None)


def _moved(launch: Launch, registry: Registry, exp: Experiment, out: Outcome, entry: dict, put_back: bool) -> str:
    """The trash entry this launch made: recorded; put back when its new run never started."""
    path = f"{entry['trash'].rstrip('/')}/{entry['name']}"
    if put_back:
        back = checkpoints.put_back(launch.target, launch.settings, entry["name"], path,
                                    what="put the checkpoints back after an interrupted launch")
        out.experiment = registry.update(exp.id, **back.fields)
        return back.said
    out.experiment = registry.update(exp.id, checkpoints_action="moved", checkpoints_entry=path)
    return f"checkpoints moved to {path} (orch checkpoints restore {entry['name']})"


def go_back(stopped: list[dict], started: bool) -> str:
    """The command that starts the one run a launch stopped again (this registry's): ``to go back: orch restart
    -e 9`` once the new run started, ``to start it again: …`` when it did not; "" when there is none to give."""
    if len(stopped) != 1 or not stopped[0].get("mine"):
        return ""
    return f"{'to go back' if started else 'to start it again'}: orch restart -e {stopped[0]['id']}"


def update_quietly(registry: Registry, run: dict, launch: Launch, **fields: Any) -> None:
    """Record a run the target stopped, if it is this registry's (its key, machine and project), else nothing."""
    from ..records.reconcile import belongs

    if not registry.owns(run):
        return  # another clone's run
    try:
        exp = registry.get(int(run["id"]))
    except OrchError:
        return
    if belongs(exp, launch.target, launch.settings.project.name):
        registry.update(exp.id, **fields)
