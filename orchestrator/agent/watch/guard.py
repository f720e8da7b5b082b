"""A guarded run's watch, by its own supervisor: is the new run as good as the one it replaced?

``orch deploy --guard`` hands the supervisor a spec in ``launch.json``'s recovery (``guard``): the window in the
run's own steps, the bounds, what to do on a failure, the parent's run key, and the number the registry keeps for
the run a rollback would start. The parent's reference is read here, from the parent's ``train.log``, with the
same reading as the new run's, so both sides are measured alike::

    step=84 loss=2.31 tok_s=31800        key=value or key: value pairs, or a JSON object per line
    {"step": 84, "loss": 2.31, "Ktok/s": 31.8}       (``metric_lines``: the agent's one metric reader)

The guard fails when the run crashes (after its restarts), stalls, or is lost (the container stopped under it, its
supervisor killed: ``fail_lost``, by the next agent call or the boot), or, once the window is over, when its
throughput over the window (its first tenth left out: compilation, data loading) is below ``min_throughput`` ×
the parent's over the same steps, or its mean loss (``[guard] loss``: the training loss, or an evaluation's,
``val_loss``) over the steps both logged is above ``max_loss_ratio`` × the parent's. ``guard.json`` in the run
folder says where it stands (what ``status`` shows); the decision and every step of the rollback after it are
journalled in ``guard.jsonl`` (``rollback.py`` carries them out).
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from .. import journal

if TYPE_CHECKING:
    from ..metrics import metric_lines
from ..layout import read_json, write_json
from .guard_state import STATE, summary  # (status reads them without this module)

JOURNAL = "guard.jsonl"
LOG = "train.log"
WRITE_EVERY_S = 0.5  # how often the progress is written while it changes
EVAL_LOSSES = ("val_loss", "test_loss")
READ_LIMIT = 16 << 20  # a parent's log is read from its end at most this far back (then: its latest rate)

def parse_line(line: str, reader: "metric_lines.Reader | None" = None, step: int | None = None) -> dict | None:
    """A log line's ``step``, losses (``loss``, ``val_loss``, ``test_loss``) and rate (``tok_s``, or ``steps_s``),
    read as the notifications read it (``metric_lines``; ``reader``: the one reading this log); an evaluation's
    line without a step of its own is at ``step``, the last one logged. None when it has no step."""
    from ..metrics import metric_lines  # (the guard's alone: the agent's other calls need no reader)

    found = metric_lines.parse(line, reader)
    if "step" not in found and (step is None or not any(k in found for k in EVAL_LOSSES)):
        return None
    out: dict = {"step": int(found.get("step", step))}
    for key in ("loss", *EVAL_LOSSES, "tok_s", "steps_s"):
        if key in found and not (key == "steps_s" and "tok_s" in out):
            out[key] = found[key]
    return out


def _points(lines, reader: "metric_lines.Reader", last: int | None) -> tuple[list[dict], int | None]:
    out = []
    for raw in lines:
        point = parse_line(raw, reader, last)
        if point is not None:
            out.append(point)
            last = point["step"]
    return out, last


def read_points(path: str) -> list[dict]:
    """Every step line of a whole log (its last ``READ_LIMIT`` bytes)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - READ_LIMIT))
            data = fh.read()
    except OSError:
        return []
    from ..metrics import metric_lines

    return _points(data.decode("utf-8", "replace").replace("\r", "\n").splitlines(), metric_lines.Reader(), None)[0]


@dataclass(frozen=True)
class Spec:
    steps: int
    min_throughput: float
    max_loss_ratio: float | None
    on_fail: str  # "rollback" | "stop"
    parent: dict  # {"id": 12, "registry": "ab12…"}
    restore: dict  # {"id": 14, "registry": "ab12…"}: the experiment a rollback starts
    loss: str = "loss"  # the loss max_loss_ratio judges: the training loss, or an evaluation's (val_loss)

    @classmethod
    def from_dict(cls, raw: object) -> "Spec | None":
        if not isinstance(raw, dict):
            return None
        return cls(steps=int(raw["steps"]), min_throughput=float(raw["min_throughput"]),
                   max_loss_ratio=None if raw.get("max_loss_ratio") is None else float(raw["max_loss_ratio"]),
                   on_fail=str(raw.get("on_fail", "rollback")), parent=dict(raw.get("parent") or {}),
                   restore=dict(raw.get("restore") or {}), loss=str(raw.get("loss") or "loss"))

    def window(self, first: int) -> tuple[int, int]:
        """The steps the comparison is made over: the window without its first tenth."""
        return first - 1 + max(1, self.steps // 10), first - 1 + self.steps


def _rate(points: list[dict], lo: int, hi: int, key: str) -> float | None:
    vals = [p[key] for p in points if key in p and lo <= p["step"] <= hi]
    return sum(vals) / len(vals) if vals else None


def _speed(value: float, key: str) -> str:
    return f"{value / 1000:.1f} Ktok/s" if key == "tok_s" else f"{value:.2f} steps/s"


def compare(spec: Spec, points: list[dict], parent: list[dict], first: int, upto: int | None = None) -> dict:
    """The window's figures against the parent's: ``ratio`` (throughput, new / parent), and ``failure`` (the
    reason in words) when a bound is broken. ``upto``: the window so far, while it is not over (progress)."""
    lo, hi = spec.window(first)
    if upto is not None and upto < hi:
        lo, hi = first - 1 + max(1, (upto - first + 1) // 10), upto
    exp = spec.parent.get("id")
    out: dict = {"from": lo, "to": hi}
    key = "tok_s" if any("tok_s" in p for p in points) else "steps_s"
    new = _rate(points, lo, hi, key)
    old = _rate(parent, lo, hi, key)
    if old is None:  # the parent never logged these steps (it resumed past them): its latest rate
        recent = [p[key] for p in parent if key in p][-max(2, hi - lo + 1):]
        old = sum(recent) / len(recent) if recent else None
    if new is not None and old:
        out["ratio"] = new / old
        if new < spec.min_throughput * old:
            out["failure"] = (f"throughput {_speed(new, key)} < {spec.min_throughput:g} × {_speed(old, key)} "
                              f"of exp {exp} over steps {lo}–{hi}")
            return out
    if spec.max_loss_ratio is not None:
        name = spec.loss
        theirs = {p["step"]: p[name] for p in parent if name in p and lo <= p["step"] <= hi}
        both = [(p[name], theirs[p["step"]]) for p in points if name in p and p["step"] in theirs]
        if both:
            mine, ref = (sum(x[i] for x in both) / len(both) for i in (0, 1))
            out["loss_ratio"] = mine / ref if ref else None
            if ref > 0 and mine > spec.max_loss_ratio * ref:
                out["failure"] = (f"{name} {mine:.3g} > {spec.max_loss_ratio:g} × {ref:.3g} of exp {exp} "
                                  f"over steps {lo}–{hi}")
    return out


class Watch:
    """The supervisor's side: ``tick`` while the command runs, ``ended`` when the run is over."""

    def __init__(self, spec: Spec, run_dir: str) -> None:
        self.spec, self.run_dir = spec, run_dir
        self.state = read_json(os.path.join(run_dir, STATE), {}) or {}  # a supervisor after a reboot goes on
        key = f"{spec.parent.get('registry')}-{spec.parent.get('id')}" if spec.parent.get("registry") \
            else str(spec.parent.get("id"))
        self.parent_log = os.path.join(os.path.dirname(run_dir), key, LOG)
        self._parent: list[dict] | None = None
        self.points: list[dict] = []
        self.offset = 0
        self.partial = b""
        from ..metrics import metric_lines

        self.reader = metric_lines.Reader()
        self.first: int | None = None
        self.written = 0.0
        self.spawned = False
        self.on_pass: Callable[[], None] | None = None  # called once the window is over with every bound held
        if not self.state:
            self._write({"state": "watching", "step": 0, "of": spec.steps, "on_fail": spec.on_fail,
                         "parent": spec.parent.get("id")})

    @property
    def parent(self) -> list[dict]:
        """The parent's steps, read once, when the new run has logged its first (its start is not delayed)."""
        if self._parent is None:
            self._parent = read_points(self.parent_log)
        return self._parent

    @property
    def open(self) -> bool:
        return self.state.get("state") == "watching"

    @property
    def failed(self) -> bool:
        return self.state.get("state") == "failed"

    def _read(self) -> None:
        try:
            with open(os.path.join(self.run_dir, LOG), "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(4 << 20)
        except OSError:
            return
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        last = self.points[-1]["step"] if self.points else None
        found, _ = _points([raw.decode("utf-8", "replace").rsplit("\r", 1)[-1] for raw in lines], self.reader, last)
        self.points += found
        if self.first is None and found:
            self.first = found[0]["step"]

    def tick(self, now: float | None = None) -> str | None:
        """Read what is new in the log; the failure's reason once the window is over and a bound broken."""
        if not self.open:
            return None
        self._read()
        if self.first is None:
            return None
        last = self.points[-1]["step"]
        done = last - self.first + 1
        if done >= self.spec.steps:
            figures = compare(self.spec, self.points, self.parent, self.first)
            if figures.get("failure"):
                return self.fail(figures["failure"])
            self._write({**self.state, "state": "passed", "step": self.spec.steps, **_figures(figures)})
            if self.on_pass is not None:
                self.on_pass()
            return None
        now = time.time() if now is None else now
        if now - self.written >= WRITE_EVERY_S:
            figures = compare(self.spec, self.points, self.parent, self.first, upto=last)
            figures.pop("failure", None)  # not over yet: only the window's end decides
            self._write({**self.state, "step": max(done, 0), **_figures(figures)})
        return None

    def ended(self, code: int, reason: str, stopped: bool) -> str | None:
        """The run is over (after its restarts) while the guard still watched: a failure unless it finished
        with every bound held, or was stopped by someone (``orch stop``)."""
        if not self.open:
            return None
        self._read()
        step = self.points[-1]["step"] if self.points else None
        at = f" at step {step}" if step is not None else " before its first step"
        if stopped:
            self._write({**self.state, "state": "stopped"})
            return None
        if reason == "stalled":
            return self.fail(f"stalled{at}")
        if code != 0:
            return self.fail(f"crashed{at} ({reason})")
        if self.first is not None:
            figures = compare(self.spec, self.points, self.parent, self.first)
            if figures.get("failure"):
                return self.fail(figures["failure"])
        self._write({**self.state, "state": "passed"})
        return None

    def fail(self, reason: str) -> str:
        """Decide: journalled first, so that whatever cuts in after this ends in a known state."""
        append(self.run_dir, {"event": "failed", "reason": reason, "on_fail": self.spec.on_fail})
        self._write({**self.state, "state": "failed", "reason": reason})
        return reason

    def stop_marker(self) -> None:
        """What makes the run read as stopped and its supervisor restart it no more (as ``orch stop``'s)."""
        write_json(os.path.join(self.run_dir, "stop_requested"), {"time": time.time(), "by": {"guard": True}})

    def start_rollback(self, agent_path: str) -> None:
        """A failed guard with ``rollback``: start the rollback in a process of its own (it outlives the pane),
        once; it starts up while the run is being stopped, and waits for its end (``rollback._stop``)."""
        if self.failed and self.spec.on_fail == "rollback" and not self.spawned:
            self.spawned = True
            spawn_rollback(self.run_dir, agent_path)

    def after_exit(self, agent_path: str) -> None:
        """The run is over: the rollback started if it was not yet, or, with ``stop``, the guard's end said."""
        if self.failed and self.spec.on_fail == "rollback":
            self.start_rollback(agent_path)
        elif self.failed:
            self._write({**self.state, "state": "stopped on failure"})

    def _write(self, state: dict) -> None:
        self.state = state
        self.written = time.time()
        try:
            write_json(os.path.join(self.run_dir, STATE), state)
        except OSError:
            pass  # a full disk: the guard still decides; status shows the last state written


def _figures(figures: dict) -> dict:
    return {k: figures[k] for k in ("ratio", "loss_ratio", "from", "to") if figures.get(k) is not None}


def append(run_dir: str, entry: dict) -> None:
    """One line of ``guard.jsonl``, fsynced before the next step starts (as a launch's journal)."""
    journal.append_line(os.path.join(run_dir, JOURNAL),
                        json.dumps({**entry, "t": time.time()}, separators=(",", ":"), default=str))


def fail_lost(run_dir: str, cause: str | None) -> dict | None:
    """A run lost while its guard watched (its supervisor gone without an exit: the container stopped, a kill):
    the guard fails as a crash's would, journalled first, once whoever notices first (the next agent call, the
    boot); its state without the window's progress. None when the guard was not watching."""
    with open(os.path.join(run_dir, JOURNAL), "ab") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # two that notice at once: one decides
        state = summary(run_dir)
        if not state or state.get("state") != "watching":
            return None
        points = read_points(os.path.join(run_dir, LOG))
        at = f" at step {points[-1]['step']}" if points else " before its first step"
        reason = f"lost{at} ({cause or 'its supervisor vanished'})"
        on_fail = state.get("on_fail", "rollback")
        append(run_dir, {"event": "failed", "reason": reason, "on_fail": on_fail})
        kept = {k: state[k] for k in ("of", "on_fail", "parent") if k in state}
        new = {**kept, "state": "failed" if on_fail == "rollback" else "stopped on failure", "reason": reason}
        write_json(os.path.join(run_dir, STATE), new)
    return new


def read_journal(run_dir: str) -> list[dict]:
    return journal.read_lines(os.path.join(run_dir, JOURNAL), 1 << 20)


def spawn_rollback(run_dir: str, agent_path: str) -> None:
    with open(os.path.join(run_dir, "guard.log"), "ab") as out:
        subprocess.Popen([sys.executable, agent_path, "rollback", run_dir], stdin=subprocess.DEVNULL, stdout=out,
                         stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
