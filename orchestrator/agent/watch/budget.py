"""A run's budget: ``ORCH_MAX_STEPS`` and ``ORCH_MAX_MINUTES`` in its environment end it gracefully.

The supervisor counts the steps from the metric lines in the run's log (``step=120``, ``step 120``,
``iter 120``: the forms the controller's log parser reads too) and, once the budget is reached, or the
minutes have passed, sends SIGINT to the command's process group, as ``orch stop`` does; a script that saves
a checkpoint on Ctrl-C saves one. What ended it is written to ``budget.json`` in the run folder: the run
then reads as finished (``runs.run_state``) and is never restarted.

    b = Budget.from_env({"ORCH_MAX_STEPS": "200"}, run_dir)
    b.check(now) -> None, or "200 steps" once reached (the caller sends the signal)
"""

from __future__ import annotations

import os
import time

from ..layout import read_json, write_json

FILE = "budget.json"
READ_MAX = 1 << 20  # bytes read from the log per check: a runaway writer cannot stall the supervisor


def _positive(raw: object) -> float | None:
    try:
        value = float(str(raw))
    except ValueError:
        return None
    return value if value > 0 else None


class Budget:
    def __init__(self, run_dir: str, max_steps: int | None, max_minutes: float | None,
                 started: float | None = None) -> None:
        self.run_dir, self.max_steps, self.max_minutes = run_dir, max_steps, max_minutes
        self.started = time.monotonic() if started is None else started
        self.log = os.path.join(run_dir, "train.log")
        self.offset = 0
        self.partial = b""
        self.step = 0
        from ..metrics import metric_lines  # (a run's watcher alone: the agent's other calls need no reader)

        self.reader, self.parse = metric_lines.Reader(), metric_lines.parse

    @classmethod
    def from_env(cls, env: dict, run_dir: str) -> "Budget | None":
        steps = _positive(env.get("ORCH_MAX_STEPS", ""))
        minutes = _positive(env.get("ORCH_MAX_MINUTES", ""))
        if steps is None and minutes is None:
            return None
        return cls(run_dir, int(steps) if steps is not None else None, minutes)

    def _read_steps(self) -> None:
        try:
            with open(self.log, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(READ_MAX)
        except OSError:
            return
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()[-4096:]
        for line in lines:
            step = self.parse(line.decode("utf-8", "replace"), self.reader).get("step")  # orch's own lines give none
            if step is not None:
                self.step = max(self.step, int(step))

    def check(self, now: float | None = None) -> str | None:
        """What of the budget is spent: ``"200 steps"``, ``"30 minutes"``, or None."""
        if self.max_steps is not None:
            self._read_steps()
            if self.step >= self.max_steps:
                return f"{self.max_steps} steps"
        now = time.monotonic() if now is None else now
        if self.max_minutes is not None and now - self.started >= self.max_minutes * 60:
            return f"{self.max_minutes:g} minutes"
        return None

    def record(self, spent: str) -> None:
        write_json(os.path.join(self.run_dir, FILE), {"spent": spent, "step": self.step, "time": time.time(),
                                                      "max_steps": self.max_steps, "max_minutes": self.max_minutes})


def spent(run_dir: str) -> dict | None:
    """What ended the run, if its budget did."""
    found = read_json(os.path.join(run_dir, FILE))
    return found if isinstance(found, dict) else None
