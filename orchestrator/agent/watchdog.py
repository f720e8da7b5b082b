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

from . import attempts, heartbeat


def watch(child: subprocess.Popen, run_dir: str, policy: attempts.Policy, stopping: list,
          log, guarded=None) -> tuple[int, bool]:
    """Wait for the child; with ``stall_timeout``, end it (SIGTERM, then SIGKILL) when its log stops growing,
    or, for a node of a job, when no node's log has grown for that long (``heartbeat``); with ``guarded``
    (a ``guard.Watch``), end it when its guard fails."""
    if policy.stall_timeout is None and (guarded is None or not guarded.open):
        return child.wait(), False
    log_path = os.path.join(run_dir, "train.log")
    progress = heartbeat.Progress(time.monotonic())
    beacon = heartbeat.Beacon(heartbeat.JobSpec.from_dict(policy.job), run_dir).open() if policy.job else None
    if beacon is not None and beacon.error:
        log.write(f"[orch] {beacon.error}: this node's stall watchdog judges its own log alone\n".encode())
    size = 0
    try:
        while True:
            try:
                return child.wait(timeout=0.2), False
            except subprocess.TimeoutExpired:
                pass
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
            return child.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    return child.wait()
