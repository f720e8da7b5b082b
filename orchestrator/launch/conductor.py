"""The conductor of a searching sweep: asks Optuna for trials, queues them, prunes from the log as printed.

One conductor process per sweep, detached from the command that started it (``orch sweep --trials N`` starts
it; ``orch sweep resume S`` starts it again), so the sweep goes on once the terminal is closed. Each round it:

1. brings the registry up to date with the targets (their queues start and end runs on their own) and reads
   what is new in each live trial's log with orch's metric reader: the script prints as it always did;
2. reports the objective at each rung crossed (every ``min_steps`` steps, or that many steps' worth of tokens
   with ``rung_by="tokens"``) to the study, and stops a trial its pruner prunes as ``orch stop`` does (SIGINT:
   its checkpoint written and kept), recorded ``pruned`` with the rung, its value and the threshold it missed;
3. tells the study each ended trial's outcome, and asks new trials until ``parallel`` are in flight.

Everything it decides is in the study's file before it acts on it, and each trial's experiment carries its
number in its message, so a conductor killed at any point and started again runs no trial twice and loses none.
"""

from __future__ import annotations

import math
import os
import re
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..errors import OrchError
from ..records.experiments import FINAL
from . import space as spaces

LAUNCH_TRIES = 3
POLL_S = 0.5  # a round also reads every live log: the time between a rung crossed and its verdict
TRIAL = re.compile(r"^sweep (\S+): trial (\d+):")
AUTO = "auto"  # the eval loss when the run prints one, else the loss
EVAL_LOSSES = ("val_loss", "test_loss")


@dataclass
class Spec:
    """What the sweep was asked to do: kept in the study, so a conductor started again needs nothing else."""
    sweep: str
    sets: list[str]
    trials: int
    sampler: str
    prune: str = "median"
    metric: str = AUTO
    mode: str = "min"
    rung_by: str = "steps"
    steps: int = 100
    min_steps: int = 10
    parallel: int = 1
    gpus: int | None = None
    targets: list[list] = field(default_factory=lambda: [[None, None]])  # (--target, --ct) each
    message: str | None = None
    seed: int | None = None
    base_tokens: int | None = None  # tokens per step of the project's own batching: a token rung's unit
    on_target: bool = False  # conducted on its one target (launch/sweep_target.py), never from here

    @property
    def rung(self) -> int:
        """The distance between rungs, in steps or tokens."""
        return self.min_steps * (self.base_tokens or 1) if self.rung_by == "tokens" else self.min_steps


def paths(state_dir: Path, sweep: str) -> dict[str, Path]:
    folder = state_dir / "sweeps"
    return {"db": folder / f"{sweep}.db", "lock": folder / f"{sweep}.lock", "log": folder / f"{sweep}.log"}


def start(state_dir: Path, spec: Spec, space: dict, study_open: Callable[..., Any]) -> Any:
    """The sweep's study created with its spec: nothing runs yet (the conductor asks the first trials)."""
    study = study_open(paths(state_dir, spec.sweep)["db"], spec.sweep, create=True, **_study_kw(spec, space))
    study.set_attr("spec", asdict(spec))
    return study


def _study_kw(spec: Spec, space: dict) -> dict:
    return dict(mode=spec.mode, sampler=spec.sampler, prune=spec.prune, first_rung=spec.rung, space=space,
                trials=spec.trials, seed=spec.seed)


@dataclass
class Hooks:
    """What the conductor asks of the layers above it: settings for a trial's overrides, a target by its flags,
    the registry, the queue, a graceful stop, and where it says what it did."""
    settings_for: Callable[[list[str]], Any]
    target_for: Callable[[Any, str | None, int | None], Any]
    registry: Callable[[Any], Any]
    echo: Callable[[str], None]


class Conductor:
    def __init__(self, state_dir: Path, sweep: str, study_open: Callable[..., Any], hooks: Hooks) -> None:
        probe = study_open(paths(state_dir, sweep)["db"], sweep)
        self.spec = Spec(**probe.attrs["spec"])
        self.space = spaces.axes(self.spec.sets)
        self.study = study_open(paths(state_dir, sweep)["db"], sweep, **_study_kw(self.spec, self.space))
        self.hooks, self.state_dir = hooks, state_dir
        self.base = hooks.settings_for([])
        self.targets = [hooks.target_for(self.base, n, c) for n, c in self.spec.targets]
        self.stopping = False
        self.clients: dict[str, Any] = {}  # an agent client per target, kept open between rounds

    def say(self, line: str) -> None:
        self.hooks.echo(f"{time.strftime('%H:%M:%S')} sweep {self.spec.sweep}: {line}")

    # -- one round ------------------------------------------------------------------------------------------
    def run(self, poll_s: float = POLL_S) -> None:
        signal.signal(signal.SIGTERM, self._stop_signal)
        trials = self.study.trials()
        self.say(f"conductor starts (process {os.getpid()}): {len(trials)} of {self.spec.trials} trial(s) asked, "
                 f"{sum(t['state'] == 'running' for t in trials)} in flight")
        try:
            while True:
                try:
                    done = self.round()
                except OrchError as exc:  # a registry held too long, a target gone: the next round tries again
                    self.say(f"round not finished: {exc.message}")
                    done = False
                if done or self.stopping:
                    break
                time.sleep(poll_s)
        finally:
            for label in list(self.clients):
                self._drop(label)
        why = "stopped" if self.stopping else "the sweep ended early" if self.study.attrs.get("error") else \
            "every trial has ended"
        self.say(f"conductor ends: {why}")

    def _stop_signal(self, *_: Any) -> None:
        self.stopping = True

    def round(self) -> bool:
        """One look at every trial; True once the sweep has ended."""
        trials = self.study.trials()
        with self.hooks.registry(self.base) as reg:
            linked = self._linked(reg, trials)
            if self.study.attrs.get("error"):
                return self._drain(reg, list(linked.values()))
            live = [t for t in trials if t["state"] == "running"]
            self._refresh(reg, [linked[t["number"]] for t in live if t["number"] in linked])
            for t in live:
                exp = linked.get(t["number"])
                if exp is None:  # asked, but the conductor ended before its launch: launch it now
                    self._launch(reg, t["number"], self.study.drawn(t["number"], self.space), len(trials))
                else:
                    self._follow(reg, t, reg.get(exp.id))
                if self.study.attrs.get("error"):
                    return self._drain(reg, list(linked.values()))
            asked = len(trials)
            in_flight = sum(1 for t in self.study.trials() if t["state"] == "running")
            while not self.stopping and in_flight < self.spec.parallel and asked < self.spec.trials:
                number, params = self.study.ask(self.space)
                self._launch(reg, number, params, asked + 1)
                asked, in_flight = asked + 1, in_flight + 1
        return asked >= self.spec.trials and in_flight == 0

    def _linked(self, reg, trials: list[dict]) -> dict[int, Any]:
        """Each trial's experiment, by the trial number in its message (written in the same step that creates
        it, so a launch the conductor did not live to note is found here)."""
        found = {}
        for exp in reg.list(sweep=self.spec.sweep):
            m = TRIAL.match(exp.message or "")
            if m and m.group(1) == self.spec.sweep:
                found.setdefault(int(m.group(2)), exp)
        for t in trials:
            if t["number"] in found and t["attrs"].get("experiment") != found[t["number"]].id:
                self.study.trial_attr(t["number"], "experiment", found[t["number"]].id)
        return found

    def _refresh(self, reg, exps: list) -> None:
        """What is new in each live trial's log, read on one connection per target held from round to round
        (a read also brings the trial's state up to date: started by the queue, ended)."""
        from ..records.reconcile import client_for, recover
        from ..watch import metrics_view

        # a launch the conductor was killed inside leaves its row launching: the target says what became of it
        for label in {self._target(e).label for e in exps if e.status == "launching"}:
            target = next(t for t in self.targets if t.label == label)
            try:
                recover(self.base, target, reg)
            except OrchError as exc:
                self.say(f"{label} not asked about a launch left unfinished: {exc.message}")
        for exp in exps:
            target = self._target(exp)
            try:
                if target.label not in self.clients:
                    self.clients[target.label] = client_for(self.base, target)
                metrics_view.refresh(self.base, target, reg, self.clients[target.label], reg.get(exp.id),
                                     budget_s=None, with_previous=False)
            except OrchError as exc:
                self.say(f"experiment {exp.id} not read on {target.label}: {exc.message}")
                self._drop(target.label)

    def _drop(self, label: str) -> None:
        client = self.clients.pop(label, None)
        if client is not None:
            client.transport.close()

    def _target(self, exp) -> Any:
        return next((t for t in self.targets if t.label == exp.target or t.name == exp.target), self.targets[0])

    # -- launching -----------------------------------------------------------------------------------------
    def _launch(self, reg, number: int, params: dict, nth: int) -> None:
        """Queue the trial; a launch that fails (the target unreachable for a moment) is tried again next round,
        and a trial that failed to launch three times is told it failed."""
        try:
            self._queue(reg, number, params, nth)
        except OrchError as exc:
            tries = int(self.study.trial_attrs(number).get("launch_errors", 0)) + 1
            self.study.trial_attr(number, "launch_errors", tries)
            self.say(f"trial {number} not launched ({tries}/{LAUNCH_TRIES}): {exc.message}")
            if tries >= LAUNCH_TRIES:
                self.study.trial_attr(number, "error", f"not launched: {exc.message}")
                self.study.tell(number, state="failed")

    def _queue(self, reg, number: int, params: dict, nth: int) -> None:
        from .sweep import queue_one

        sets = [spaces.as_set(k, v) for k, v in params.items()]
        settings = self.hooks.settings_for(sets)
        steps = self.spec.steps
        if self.spec.rung_by == "tokens" and self.spec.base_tokens:
            # the same data for every trial: a trial with twice the tokens per step runs half the steps
            steps = max(1, math.ceil(steps * self.spec.base_tokens / _tokens_per_step_of(settings)))
        target = self.targets[number % len(self.targets)]
        said = ", ".join(f"{k}={_short(v)}" for k, v in params.items()
                         if not (isinstance(self.space.get(k), spaces.Choice) and len(self.space[k].values) == 1))
        exp, position = queue_one(settings, target, reg, sweep=self.spec.sweep, echo=lambda _m: None,
                                  env={"ORCH_MAX_STEPS": str(steps), "ORCH_SWEEP_TRIAL": str(number)},
                                  message=f"sweep {self.spec.sweep}: trial {number}: {said}"
                                  + (f" ({self.spec.message})" if self.spec.message else ""),
                                  beside_gpus=self.spec.gpus)
        self.study.trial_attr(number, "experiment", exp.id)
        self.study.trial_attr(number, "budget_steps", steps)
        where = "started" if exp.status == "running" else f"queued at position {position}"
        self.say(f"trial {number} ({nth}/{self.spec.trials}): {said}: experiment {exp.id} {where} on {target.label}")

    # -- following -----------------------------------------------------------------------------------------
    def _follow(self, reg, trial: dict, exp) -> None:
        number, attrs = trial["number"], trial["attrs"]
        if exp.status == "failed" and exp.started is None and "pruned" not in attrs:
            tries = int(attrs.get("relaunches", 0)) + 1
            if tries <= LAUNCH_TRIES:  # its launch never finished (the conductor was killed inside it)
                self.study.trial_attr(number, "relaunches", tries)
                self.say(f"trial {number}: experiment {exp.id} was never started ({exp.error or 'launch cut short'}): "
                         "launched again")
                return self._launch(reg, number, trial["params"], number + 1)
        stored = reg.metrics(exp.id)
        metric = self._metric(stored)
        points = _points(stored, metric) if metric else []
        last_step = float((((stored or {}).get("summary") or {}).get("_state") or {}).get("last_step") or 0)
        scale = _tokens_per_step(exp, stored) if self.spec.rung_by == "tokens" else 1
        if not scale:
            return self._error(reg, number, exp, "with --rung-by tokens a trial needs a recorded token budget "
                               "([batching] token_budget) or a tokens= count in its log", ended=exp.status in FINAL)
        if metric and not points and last_step >= self.spec.min_steps:
            prints = ", ".join(sorted(_all_series(stored))) or "nothing orch reads"
            return self._error(reg, number, exp, f"the log printed no {metric!r} by step {last_step:g} "
                               f"(it prints: {prints})", ended=exp.status in FINAL)
        reported = int(attrs.get("rungs", 0))
        rung = self.spec.rung
        reached = int(last_step * scale // rung)
        pruned = attrs.get("pruned")
        for k in range(reported + 1, reached + 1):
            at = k * rung
            upto = [y for x, y in points if x * scale <= at]
            if not upto:
                continue
            self.study.report(number, at, upto[-1])
            self.study.trial_attr(number, "rungs", k)
            if pruned is None and exp.status == "running" and self.study.should_prune(number):
                pruned = {"rung": k, "at": at, "value": upto[-1], "step": last_step, "unit": self.spec.rung_by,
                          "threshold": self._threshold(number, at)}
                self.study.trial_attr(number, "pruned", pruned)  # kept before the stop: a restart finishes it
                self.say(f"trial {number} pruned at rung {k} ({at} {self.spec.rung_by}): {metric} {upto[-1]:.4g}, "
                         f"threshold {_fmt(pruned['threshold'])}")
                break
        if pruned is not None and exp.status not in FINAL:
            self._stop(reg, exp)
            exp = reg.get(exp.id)
        if exp.status not in FINAL:
            return
        self.study.trial_attr(number, "steps", last_step)
        self.study.trial_attr(number, "tokens", last_step * scale if self.spec.rung_by == "tokens"
                              else last_step * (_tokens_per_step(exp, stored) or 0) or None)
        if pruned is not None:
            self.study.tell(number, state="pruned")
        elif exp.status == "finished" and points:
            self.study.tell(number, points[-1][1])
            self.say(f"trial {number} complete: {metric} {points[-1][1]:.4g} after {last_step:g} steps")
        else:
            self.study.trial_attr(number, "error", exp.end_reason or exp.error or exp.status)
            self.study.tell(number, state="failed")
            self.say(f"trial {number} {exp.status}: {exp.end_reason or exp.error or ''}")

    def _metric(self, stored: dict | None) -> str | None:
        if self.spec.metric != AUTO:
            return self.spec.metric
        chosen = self.study.attrs.get("metric")
        if chosen:
            return chosen
        series = _all_series(stored)
        if not series:
            return None
        chosen = next((k for k in EVAL_LOSSES if k in series), "loss")
        self.study.set_attr("metric", chosen)  # one objective for every trial of the sweep
        return chosen

    def _threshold(self, number: int, at: int) -> float | None:
        """The value the trial had to beat at that rung, as each pruner reckons it: the median of the complete
        trials' values there (median), or the cut-off of the best third of every trial that reached it (asha)."""
        from ..agent.queue.search import threshold

        states = ("complete", "pruned", "running") if self.spec.prune == "asha" else ("complete",)
        return threshold(self.spec.prune, self.spec.mode, self.study.values_at(at, number, states))

    def _stop(self, reg, exp) -> None:
        from . import prepare
        from .operations import execute

        target = self._target(exp)
        settings = self.base
        try:
            halt = prepare.stop(settings, target, echo=lambda _m: None)
            halt.stop_ids = [exp.id]
            execute(halt, reg)
        except OrchError as exc:
            self.say(f"experiment {exp.id} not stopped yet: {exc.message}")

    def _error(self, reg, number: int, exp, why: str, *, ended: bool) -> None:
        """A sweep that cannot read its objective ends: every trial would say the same."""
        from . import queueing

        self.say(f"trial {number}: {why}; the sweep ends")
        self.study.set_attr("error", why)
        self.study.trial_attr(number, "error", why)
        for target in self.targets:
            try:
                queueing.remove(self.base, target, reg, sweep=self.spec.sweep)
            except OrchError as exc:
                self.say(f"queue on {target.label} not emptied: {exc.message}")
        for t in self.study.trials():
            if t["state"] == "running":
                self.study.tell(t["number"], state="failed")

    def _drain(self, reg, exps: list) -> bool:
        """After an error, every trial still running is stopped; True once none is (a stop that did not land
        this round is tried again the next)."""
        left = [e for e in (reg.get(e.id) for e in exps) if e.status not in FINAL]
        self._refresh(reg, left)
        for exp in left:
            if reg.get(exp.id).status not in FINAL:
                self._stop(reg, reg.get(exp.id))
        return all(reg.get(e.id).status in FINAL for e in exps)


def _all_series(stored: dict | None) -> dict:
    return (stored or {}).get("series", {})


def _points(stored: dict | None, key: str) -> list[tuple[float, float]]:
    from ..watch.metrics import Series

    series = _all_series(stored)
    return Series.from_dict(series[key]).points() if key in series else []


def _tokens_per_step_of(settings) -> int:
    return int(settings.batching.token_budget)


def _tokens_per_step(exp, stored: dict | None) -> float | None:
    """The trial's recorded token budget, else the ``tokens=`` count its log prints over its steps."""
    budget = (exp.batching or {}).get("token_budget")
    if budget:
        return float(budget)
    state = ((stored or {}).get("summary") or {}).get("_state") or {}
    if state.get("tokens") and state.get("last_step"):
        return float(state["tokens"]) / float(state["last_step"])
    return None


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def locked(lock_path: Path):
    """The sweep's conductor lock, or None when another conductor holds it (it goes on; this one ends)."""
    from ..agent.queue.search import locked as take  # one lock, wherever a sweep's conductor runs

    return take(str(lock_path))


def holder(lock_path: Path) -> int | None:
    """The pid of the live conductor of a sweep, or None."""
    from ..agent.queue.search import holder as held

    return held(str(lock_path))
