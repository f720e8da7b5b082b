"""A supervisor's stall watchdog: end the command when its run has stopped making progress.

One run alone is stalled when its log has not grown for ``[run] stall_timeout``; a node of a job over
several nodes only when no node's log has grown for that long (its peers' sizes come from ``heartbeat``),
because the non-zero ranks of most DDP scripts print nothing while they train.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Callable

from . import attempts, heartbeat


def watch(child: subprocess.Popen, run_dir: str, policy: attempts.Policy, stopping: list,
          log, tick: Callable[[], None] | None = None, budget=None, guarded=None) -> tuple[int, bool]:
    """Wait for the child; with ``stall_timeout``, end it (SIGTERM, then SIGKILL) when its log stops growing,
    or, for a node of a job, when no node's log has grown for that long (``heartbeat``); with a ``budget``
    (``budget.Budget``), SIGINT once it is spent, then SIGTERM and SIGKILL if the command lingers; with
    ``guarded`` (a ``guard.Watch``), end it when its guard fails. ``tick`` is called about every 0.2 s meanwhile
    (the notifications that read the log's metrics)."""
    if policy.stall_timeout is None and budget is None and (guarded is None or not guarded.open):
        while tick is not None:
            try:
                return wait_child(child, 0.2), False
            except subprocess.TimeoutExpired:
                tick()
        return child.wait(), False
    log_path = os.path.join(run_dir, "train.log")
    progress = heartbeat.Progress(time.monotonic())
    beacon = heartbeat.Beacon(heartbeat.JobSpec.from_dict(policy.job), run_dir).open() if policy.job else None
    if beacon is not None and beacon.error:
        log.write(f"[orch] {beacon.error}: this node's stall watchdog judges its own log alone\n".encode())
    size = 0
    ending: float | None = None  # when the budget's SIGINT was sent
    ticked = time.monotonic()
    try:
        while True:
            try:
                return wait_child(child, 0.2 if budget is None else 0.02), False
            except subprocess.TimeoutExpired:
                pass
            if tick is not None and time.monotonic() - ticked >= 0.2:
                ticked = time.monotonic()
                tick()
            if budget is not None:
                if ending is None and not stopping and (spent := budget.check()):
                    budget.record(spent)
                    log.write(f"[orch] budget reached ({spent}): SIGINT, as orch stop sends\n".encode())
                    ending = time.monotonic()
                    try:
                        os.killpg(child.pid, signal.SIGINT)
                    except ProcessLookupError:
                        pass
                elif ending is not None and time.monotonic() - ending > max(policy.term_timeout, BUDGET_GRACE):
                    return end_stalled(child, policy.term_timeout), False
                if policy.stall_timeout is None and guarded is None:
                    continue
            try:
                size = os.stat(log_path).st_size
            except OSError:
                pass
            if guarded is not None and guarded.tick() is not None:
                guarded.stop_marker()
                guarded.start_rollback(os.path.abspath(sys.argv[0]))  # the supervisor runs as the agent
                log.write(f"[orch] guard failed: {guarded.state['reason']}\n".encode())
                return end_stalled(child, policy.term_timeout), False
            now = time.monotonic()
            progress.own_size(size, now)
            if stopping:
                progress.touch(now)
            if beacon is not None:
                beacon.tick(size, progress, now)
            if policy.stall_timeout is not None and progress.stalled(now, policy.stall_timeout):
                if beacon is not None and beacon.sock is not None and not progress.peers:
                    log.write(f"[orch] no heartbeat came from the job's other nodes (UDP port {beacon.spec.port}):"
                              " is it open between the nodes?\n".encode())
                return end_stalled(child, policy.term_timeout), True
    finally:
        if beacon is not None:
            beacon.close()


BUDGET_GRACE = 30.0  # s a command has after its budget's SIGINT before SIGTERM


def stall_note(policy: attempts.Policy) -> str:
    """The line a stalled attempt leaves in the log."""
    if policy.job:
        return f"[orch] no new log line on any node of the job for {policy.stall_timeout:g} s: stopped as stalled\n"
    return f"[orch] no new log line for {policy.stall_timeout:g} s: stopped as stalled\n"


def end_stalled(child: subprocess.Popen, term_timeout: float) -> int:
    for sig, wait in ((signal.SIGTERM, term_timeout), (signal.SIGKILL, None)):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            pass
        try:
            return wait_child(child, wait)
        except subprocess.TimeoutExpired:
            continue
    return child.wait()


def wait_child(child: subprocess.Popen, timeout: float | None) -> int:
    """``child.wait(timeout)`` that returns the moment the child exits. Popen's own wait with a timeout polls, its
    naps doubling up to 50 ms, so a stopped command's exit was seen (and recorded, and the stop answered) up to 50 ms
    after it came; a pidfd (Linux 5.3+) is readable as the process exits. Where there is none, Popen's wait."""
    if timeout is None or child.returncode is not None:
        return child.wait(timeout=timeout)
    try:
        fd = os.pidfd_open(child.pid)
    except (AttributeError, OSError):  # an older Python or kernel, or a sandbox that refuses the call
        return child.wait(timeout=timeout)
    try:
        import select

        ready = select.select([fd], [], [], timeout)[0]
    finally:
        os.close(fd)
    if not ready:
        raise subprocess.TimeoutExpired(child.args, timeout)
    return child.wait()
