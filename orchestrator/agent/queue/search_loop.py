"""The conductor of a sweep handed to its target (``search``): the controller's conductor's rounds, with the
target's own files for the registry: a trial is a queue entry made from the template, its state its run folder's,
its objective read from its log with the agent's metric reader.

Each round it reads what is new in each live trial's log, reports the objective at each rung crossed to the study
and stops a pruned trial (SIGINT, as ``orch stop``: its checkpoint written and kept); tells the study each ended
trial's outcome; and asks trials until ``parallel`` are in flight. The trial's experiment number is written to
the study before its entry is queued, and an entry is queued only where neither it nor its run folder is, so a
conductor killed at any point (or a reboot) and started again runs no trial twice and loses none.

    agent sweep-conduct ROOT PROJECT SWEEP
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from .. import journal
from ..layout import Layout, read_json, write_atomic, write_json
from ..lock import TargetLock
from ..metrics import metric_lines
from ..protocol import AgentFailure
from ..run import reboot_unit, runs
from . import runqueue, search

POLL_S = 0.5
LOCK_WAIT = 600.0
FINAL = ("finished", "crashed", "stopped", "failed", "lost")
EVAL_LOSSES = ("val_loss", "test_loss")
READ_MAX = 8 << 20  # bytes of a log read a round


class Log:
    """One trial's log read as it grows: its last step and the objective's points (step, value)."""

    def __init__(self, path: str) -> None:
        self.path, self.offset, self.partial = path, 0, b""
        self.reader = metric_lines.Reader()
        self.step = 0.0
        self.series: dict[str, list[tuple[float, float]]] = {}

    def read(self) -> None:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(READ_MAX)
        except OSError:
            return
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        for line in lines:
            for found in self.reader.events(line.decode("utf-8", "replace")):
                step = found.get("step")
                if step is None:
                    continue
                self.step = max(self.step, float(step))
                for key, value in found.items():
                    if key != "step" and isinstance(value, (int, float)):
                        self.series.setdefault(key, []).append((float(step), float(value)))


class Conductor:
    def __init__(self, root: str, project: str, sweep: str) -> None:
        self.layout, self.project, self.sweep = Layout(root), project, sweep
        self.where = search.folder(self.layout, project, sweep)
        self.spec = read_json(os.path.join(self.where, "spec.json"), {}) or {}
        self.template = read_json(os.path.join(self.where, "template.json"), {}) or {}
        self.optuna = optuna = search.optuna_module()
        spec = self.spec
        self.space = {k: optuna.distributions.json_to_distribution(v) for k, v in spec["space"].items()}
        storage = optuna.storages.RDBStorage(f"sqlite:///{os.path.join(self.where, 'study.db')}",
                                             engine_kwargs={"connect_args": {"timeout": 30}})
        seed = spec.get("seed")
        if seed is not None:  # seeded again where it left off: the same seed would draw the same first values
            seed += len(optuna.load_study(study_name=sweep, storage=storage).trials)
        self.study = optuna.load_study(
            study_name=sweep, storage=storage,
            sampler=search.sampler(optuna, spec["sampler"], spec.get("grid") or {}, spec["trials"], seed),
            pruner=search.pruner(optuna, spec["prune"], spec["min_steps"]))
        self.logs: dict[int, Log] = {}
        self.stopping = False
        self.changed = True

    def say(self, line: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} sweep {self.sweep}: {line}", flush=True)

    def run(self) -> int:
        fd = search.locked(os.path.join(self.where, ".lock"))
        if fd is None:
            return ELSEWHERE
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "stopping", True))
        try:
            trials = self.study.get_trials(deepcopy=False)
            self.say(f"conductor starts on the target (process {os.getpid()}): {len(trials)} of "
                     f"{self.spec['trials']} trial(s) asked")
            done = False
            while not self.stopping and not done:
                try:
                    done = self.round()
                except AgentFailure as exc:  # the target's lock held long: the next round tries again
                    self.say(f"round not finished: {exc.message}")
                self._snapshot()
                if not done:
                    time.sleep(POLL_S)
            if done:
                spec = read_json(os.path.join(self.where, "spec.json"), {}) or {}
                write_json(os.path.join(self.where, "spec.json"), dict(spec, ended="every trial has ended"))
                reboot_unit.remove(self.where)
            self.say("conductor ends: " + ("every trial has ended" if done else "stopped"))
        finally:
            os.close(fd)
        return 0

    def _snapshot(self) -> None:
        """A copy of the study for ``search.read`` between rounds (no write of this process is under way)."""
        if not self.changed:
            return
        with open(os.path.join(self.where, "study.db"), "rb") as fh:
            write_atomic(os.path.join(self.where, "study.snapshot.db"), fh.read(), 0o600)
        self.changed = False

    # -- one round -------------------------------------------------------------------------------------------
    def round(self) -> bool:
        trials = self.study.get_trials(deepcopy=False)
        for t in trials:
            if t.state.name != "RUNNING":
                continue
            exp_id = t.user_attrs.get("experiment")
            if exp_id is None:
                exp_id = self._number_for(t.number)
                self._attr(t.number, "experiment", exp_id)
            self._follow(t, int(exp_id))
        asked = len(trials)
        in_flight = sum(1 for t in self.study.get_trials(deepcopy=False) if t.state.name == "RUNNING")
        if self.study.user_attrs.get("error"):  # the sweep ended early: the trials still in flight are told
            for t in self.study.get_trials(deepcopy=False):
                if t.state.name == "RUNNING" and not self._started(int(t.user_attrs.get("experiment", -1))):
                    self._tell(t.number, None, self.optuna.trial.TrialState.FAIL)  # taken out of the queue
            return not any(t.state.name == "RUNNING" for t in self.study.get_trials(deepcopy=False))
        while not self.stopping and in_flight < self.spec["parallel"] and asked < self.spec["trials"]:
            trial = self.study.ask(self.space)
            exp_id = self._number_for(trial.number)
            self._attr(trial.number, "experiment", exp_id)  # before its entry: a restart finds it
            self._queue(trial.number, trial.params, exp_id)
            asked, in_flight = asked + 1, in_flight + 1
        return asked >= self.spec["trials"] and in_flight == 0

    def _drawn(self, trial) -> dict:
        """The trial's parameters, every one of the space: an ask draws them one by one (Optuna's ``ask`` stores each as
        it suggests it), so a conductor that ended inside one left a trial with some of them; the rest are drawn now,
        as that ask would have, never run with the command's defaults in their place."""
        if all(k in trial.params for k in self.space):
            return trial.params
        live = self.optuna.Trial(self.study, trial._trial_id)
        for key, dist in self.space.items():
            live._suggest(key, dist)  # a parameter drawn already is given back as it was
        self.changed = True
        return live.params

    def _number_for(self, number: int) -> int:
        """The experiment number the controller reserved for trial ``number`` (trial 0's is the template's)."""
        return int(self.spec["template"]) if number == 0 else int(self.spec["reserved"][number - 1])

    def _attr(self, number: int, key: str, value) -> None:
        storage = self.study._storage
        storage.set_trial_user_attr(storage.get_trial_id_from_study_id_trial_number(self.study._study_id, number),
                                    key, value)
        self.changed = True

    def _run_dir(self, exp_id: int) -> str:
        return self.layout.run_dir(exp_id, self.spec.get("registry"))

    def _queued(self, exp_id: int) -> bool:
        return runqueue.entry(self.layout, self.project, exp_id, self.spec.get("registry")) is not None

    # -- queueing ----------------------------------------------------------------------------------------------
    def _queue(self, number: int, params: dict, exp_id: int) -> None:
        """The trial's entry, made from the template: its values in the environment, its budget, its number, its
        own checkpoint folder; started at once when nothing of the project runs."""
        entry = json.loads(json.dumps(self.template))
        tid = int(self.spec["template"])
        old = str((entry.get("experiment") or {}).get("checkpoints") or "")
        new = old[: -len(f"exp{tid}")] + f"exp{exp_id}" if old.endswith(f"exp{tid}") else old
        if old and new != old:  # a variant's folder of its own, wherever the template names it
            entry = _replaced(entry, old, new)
        env = dict(entry.get("env") or {})
        for key, value in params.items():
            env[key[len("project.env."):]] = repr(value) if isinstance(value, float) else str(value)
        env.update(ORCH_MAX_STEPS=str(self.spec["steps"]), ORCH_SWEEP_TRIAL=str(number))
        said = ", ".join(f"{k}={_short(v)}" for k, v in params.items() if k in self.spec.get("shown", params))
        message = f"sweep {self.sweep}: trial {number}: {said}" + \
            (f" ({self.spec['message']})" if self.spec.get("message") else "")
        experiment = dict(entry.get("experiment") or {}, id=exp_id, message=message, created=time.time())
        self._attr(number, "message", message)
        self._attr(number, "checkpoints", new or None)
        self._attr(number, "budget_steps", self.spec["steps"])
        args = {k: entry[k] for k in runqueue.START_ARGS if k in entry and k not in ("exp_id", "env", "experiment")}
        if entry.get("beside"):
            args["beside"] = entry["beside"]
        with TargetLock(self.layout.lock, LOCK_WAIT, f"queue trial {number} of sweep {self.sweep}"):
            # queued already when a kill cut this conductor short between the entry and its note
            done = None if self._queued(exp_id) or self._started(exp_id) else \
                runqueue.add(self.layout, exp_id=exp_id, env=env, experiment=experiment, **args)
        self._attr(number, "queued", time.time())  # the controller records the trial's experiment from here on
        if done is not None:
            where = "started" if done.get("status") == "running" else f"queued at position {done.get('position')}"
            self.say(f"trial {number} ({number + 1}/{self.spec['trials']}): {said}: experiment {exp_id} {where}")

    def _started(self, exp_id: int) -> bool:
        run_dir = self._run_dir(exp_id)
        return os.path.lexists(run_dir) and not journal.only_launch(run_dir)

    # -- following -----------------------------------------------------------------------------------------------
    def _follow(self, trial, exp_id: int) -> None:
        number, attrs = trial.number, trial.user_attrs
        if self.study.user_attrs.get("error") and not self._started(exp_id):
            return  # the sweep ended: taken out of the queue, never queued again (round tells it)
        if not self._queued(exp_id) and not self._started(exp_id):
            return self._queue(number, self._drawn(trial), exp_id)  # asked, and the conductor ended before its entry
        if "queued" not in attrs:  # queued, and the conductor ended before its note: the controller records it
            self._attr(number, "queued", time.time())
        if not self._started(exp_id):
            return  # waiting in the queue
        run_dir = self._run_dir(exp_id)
        state = runs.run_state(run_dir)
        status = state.get("state")
        if status == "lost" and reboot_unit.installed(run_dir):
            status = "running"  # it resumes after the reboot (its unit is in place)
        log = self.logs.setdefault(exp_id, Log(os.path.join(run_dir, runs.LOG)))
        log.read()
        metric = self._metric(log)
        points = log.series.get(metric, []) if metric else []
        if metric and not points and log.step >= self.spec["min_steps"]:
            # every trial would say the same: the sweep ends, its queued trials taken out, this one stopped
            why = f"the log printed no {metric!r} by step {log.step:g} (it prints: " \
                  f"{', '.join(sorted(log.series)) or 'nothing orch reads'})"
            self.say(f"trial {number}: {why}; the sweep ends")
            self.study.set_user_attr("error", why)
            self._attr(number, "error", why)
            with TargetLock(self.layout.lock, LOCK_WAIT, f"end sweep {self.sweep}"):
                runqueue.remove(self.layout, self.project, registry=self.spec.get("registry"), sweep=self.sweep)
                if status not in FINAL:
                    runs.stop(self.layout, self.project, [exp_id], float(self.spec.get("stop_timeout", 30)),
                              float(self.spec.get("term_timeout", 10)), by={"sweep": self.sweep},
                              registry=self.spec.get("registry"))
            self._tell(number, None, self.optuna.trial.TrialState.FAIL)
            return
        rung = int(self.spec["min_steps"])
        reported = int(attrs.get("rungs", 0))
        pruned = attrs.get("pruned")
        for k in range(reported + 1, int(log.step // rung) + 1):
            at = k * rung
            upto = [y for x, y in points if x <= at]
            if not upto:
                continue
            live = self.optuna.trial.Trial(self.study, trial._trial_id)
            live.report(upto[-1], at)
            self._attr(number, "rungs", k)
            if pruned is None and status == "running" and live.should_prune():
                pruned = {"rung": k, "at": at, "value": upto[-1], "step": log.step, "unit": "steps",
                          "threshold": self._threshold(number, at)}
                self._attr(number, "pruned", pruned)  # kept before the stop: a restart finishes it
                self.say(f"trial {number} pruned at rung {k} ({at} steps): {metric} {upto[-1]:.4g}, threshold "
                         f"{pruned['threshold']}")
                break
        if pruned is not None and status not in FINAL:
            with TargetLock(self.layout.lock, LOCK_WAIT, f"stop pruned trial {number} of sweep {self.sweep}"):
                runs.stop(self.layout, self.project, [exp_id], float(self.spec.get("stop_timeout", 30)),
                          float(self.spec.get("term_timeout", 10)), by={"sweep": self.sweep},
                          registry=self.spec.get("registry"))
            status = runs.run_state(run_dir).get("state")
            log.read()
        if status not in FINAL:
            return
        per_step = (entry_batching(self.template) or {}).get("token_budget")
        self._attr(number, "steps", log.step)
        self._attr(number, "tokens", log.step * float(per_step) if per_step else None)
        states = self.optuna.trial.TrialState
        if pruned is not None:
            self._tell(number, None, states.PRUNED)
        elif status == "finished" and points:
            self._tell(number, points[-1][1], states.COMPLETE)
            self.say(f"trial {number} complete: {metric} {points[-1][1]:.4g} after {log.step:g} steps")
        else:
            self._attr(number, "error", state.get("cause") or state.get("error") or status)
            self._tell(number, None, states.FAIL)
            self.say(f"trial {number} {status}")
        self.changed = True

    def _tell(self, number: int, value: float | None, state) -> None:
        self.changed = True
        try:
            self.study.tell(number, value, state=state, skip_if_finished=True)
        except RuntimeError as exc:
            # the grid sampler calls study.stop() once its grid is told, which only optimize() allows; the
            # outcome is stored before that, and no more trials are asked
            if "Study.stop" not in str(exc):
                raise

    def _metric(self, log: Log) -> str | None:
        chosen = self.spec.get("metric")
        if chosen and chosen != "auto":
            return chosen
        chosen = self.study.user_attrs.get("metric")
        if chosen:
            return chosen
        if not log.series:
            return None
        chosen = next((k for k in EVAL_LOSSES if k in log.series), "loss")
        self.study.set_user_attr("metric", chosen)  # one objective for every trial of the sweep
        return chosen

    def _threshold(self, number: int, at: int) -> float | None:
        states = ("COMPLETE", "PRUNED", "RUNNING") if self.spec["prune"] == "asha" else ("COMPLETE",)
        values = [t.intermediate_values[at] for t in self.study.get_trials(deepcopy=False)
                  if t.number != number and t.state.name in states and at in t.intermediate_values]
        return search.threshold(self.spec["prune"], self.spec["mode"], values)


def entry_batching(entry: dict) -> dict:
    return entry.get("batching") or {}


def _replaced(value, old: str, new: str):
    """``value`` with every string equal to ``old``, or under it, naming ``new`` instead."""
    if isinstance(value, str):
        return new + value[len(old):] if value == old or value.startswith(old + "/") else value
    if isinstance(value, list):
        return [_replaced(v, old, new) for v in value]
    if isinstance(value, dict):
        return {k: _replaced(v, old, new) for k, v in value.items()}
    return value


def _short(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


ELSEWHERE = 3  # the exit of a conductor that found another holding the sweep's lock
QUICK_S = 10.0  # s: a conductor that ends sooner than this, on an error, five times running, is not started again


def conduct(root: str, project: str, sweep: str) -> int:
    """``agent sweep-conduct ROOT PROJECT SWEEP``: the conductor in a child process, started again when it dies
    (killed, crashed) while the sweep goes on: the end of a trial starts a missing conductor too, but one killed
    after the last trial in flight ended would have none to wait for."""
    os.environ["LC_ALL"] = "C.UTF-8"
    child = 0
    signal.signal(signal.SIGTERM, lambda *_: child and os.kill(child, signal.SIGTERM))
    quick = 0
    while True:
        began = time.monotonic()
        child = os.fork()
        if child == 0:
            code = 1
            try:
                code = _once(root, project, sweep)
            finally:
                sys.stdout.flush()
                os._exit(code)
        _, status = os.waitpid(child, 0)
        code = os.waitstatus_to_exitcode(status)
        spec = read_json(os.path.join(search.folder(Layout(root), project, sweep), "spec.json"), {}) or {}
        if code in (0, ELSEWHERE) or spec.get("ended"):
            return 0
        quick = quick + 1 if time.monotonic() - began < QUICK_S else 0
        print(f"{time.strftime('%H:%M:%S')} sweep {sweep}: the conductor ended ({code}): "
              + ("started again" if quick < 5 else "five times within seconds: not started again"), flush=True)
        if quick >= 5:
            return 1
        time.sleep(1.0)


def _once(root: str, project: str, sweep: str) -> int:
    try:
        conductor = Conductor(root, project, sweep)
    except ImportError as exc:
        print(f"orch: sweep {sweep}: its conductor cannot import {exc.name}", flush=True)
        return 1
    # the first trial waits in the queue for the template to be kept: start the queue now
    try:
        runqueue.advance(conductor.layout, project)
    except AgentFailure as exc:
        conductor.say(f"queue not started: {exc.message}")
    return conductor.run()
