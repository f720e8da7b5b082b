"""A searching sweep's Optuna study: the only importer of optuna (the ``sweep`` extra).

The study lives in one SQLite file per sweep (``.orch/sweeps/<sweep>.db``, Optuna's RDB storage), so a conductor
that is killed and started again finds every trial as it was: asked, reported, told. orch uses Optuna's
ask-and-tell interface only: a trial is asked when a slot frees, told the values read from its log at each rung,
and told ``pruned``, failed or its final value; Optuna's samplers and pruners decide.

    study = Study.open(path, "s1a2b3c", mode="min", sampler="tpe", prune="median", first_rung=20, seed=1)
    number, params = study.ask(space)
    study.report(number, 40, 0.91); study.should_prune(number) -> bool
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import InputError, OrchError
from .space import Choice, Dist, Range

STATES = {"RUNNING": "running", "COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed", "WAITING": "waiting"}


def _optuna():
    try:
        import optuna
    except ImportError:
        raise InputError("a sweep that searches needs Optuna, which is not installed",
                         hint="pip install 'orch[sweep]' (or pip install optuna)") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def _distribution(optuna, dist: Dist):
    d = optuna.distributions
    if isinstance(dist, Choice):
        return d.CategoricalDistribution(list(dist.values))
    if dist.integer:
        return d.IntDistribution(int(dist.low), int(dist.high), log=dist.log)
    return d.FloatDistribution(dist.low, dist.high, log=dist.log)


def _sampler(optuna, name: str, space: dict[str, Dist], trials: int, seed: int | None):
    from ..agent.queue.search import sampler  # the same sampler a conductor on the target sets up

    return sampler(optuna, name, {k: list(d.values) for k, d in space.items() if isinstance(d, Choice)}, trials, seed)


def _pruner(optuna, name: str, first_rung: int):
    from ..agent.queue.search import pruner

    return pruner(optuna, name, first_rung)


def distributions(space: dict[str, Dist]) -> dict[str, str]:
    """Each axis as Optuna's JSON of its distribution: what a conductor on the target asks with."""
    optuna = _optuna()
    return {k: optuna.distributions.distribution_to_json(_distribution(optuna, d)) for k, d in space.items()}


class Study:
    def __init__(self, optuna, study) -> None:
        self.optuna, self.study = optuna, study

    @classmethod
    def open(cls, path: Path, name: str, *, mode: str = "min", sampler: str = "tpe", prune: str = "median",
             first_rung: int = 1, space: dict[str, Dist] | None = None, trials: int = 1, seed: int | None = None,
             create: bool = False) -> "Study":
        optuna = _optuna()
        kw = dict(study_name=name, storage=_storage(optuna, path),
                  sampler=_sampler(optuna, sampler, space or {}, trials, seed), pruner=_pruner(optuna, prune, first_rung))
        try:
            if create:
                study = optuna.create_study(direction="minimize" if mode == "min" else "maximize", **kw)
            else:
                study = optuna.load_study(**kw)
        except (KeyError, optuna.exceptions.DuplicatedStudyError) as exc:
            raise OrchError(f"the study of sweep {name} in {path}: {exc}",
                            hint="orch experiments list shows each experiment's sweep") from None
        return cls(optuna, study)

    @classmethod
    def in_memory(cls, name: str, *, mode: str = "min", sampler: str = "tpe", prune: str = "median",
                  first_rung: int = 1, space: dict[str, Dist] | None = None, trials: int = 1,
                  seed: int | None = None) -> "Study":
        """The same study kept in memory (benchmarks/bench_search.py: a simulated sweep has nothing to resume)."""
        optuna = _optuna()
        return cls(optuna, optuna.create_study(
            study_name=name, direction="minimize" if mode == "min" else "maximize",
            sampler=_sampler(optuna, sampler, space or {}, trials, seed), pruner=_pruner(optuna, prune, first_rung)))

    @classmethod
    def read(cls, path: Path, name: str) -> "Study":
        """The study to look at (``sweep show``): no sampler or pruner is set up."""
        optuna = _optuna()
        return cls(optuna, optuna.load_study(study_name=name, storage=_storage(optuna, path)))

    # the sweep's own settings, kept with its trials so a conductor started again needs nothing else
    @property
    def attrs(self) -> dict[str, Any]:
        return self.study.user_attrs

    def set_attr(self, key: str, value: Any) -> None:
        self.study.set_user_attr(key, value)

    def ask(self, space: dict[str, Dist]) -> tuple[int, dict[str, Any]]:
        trial = self.study.ask({k: _distribution(self.optuna, d) for k, d in space.items()})
        return trial.number, trial.params

    def drawn(self, number: int, space: dict[str, Dist]) -> dict[str, Any]:
        """Trial ``number``'s parameters, every one of ``space``: an ask draws them one by one (Optuna stores each as
        it suggests it), so a conductor that ended inside one left a trial with some of them; the rest are drawn now,
        as that ask would have."""
        trial = self._trial(number)
        for key, dist in space.items():
            trial._suggest(key, _distribution(self.optuna, dist))  # one drawn already is given back as it was
        return trial.params

    def _trial(self, number: int):
        frozen = self.study._storage.get_trial(self._id(number))
        return self.optuna.trial.Trial(self.study, frozen._trial_id)

    def _id(self, number: int) -> int:
        return self.study._storage.get_trial_id_from_study_id_trial_number(self.study._study_id, number)

    def trial_attr(self, number: int, key: str, value: Any) -> None:
        self.study._storage.set_trial_user_attr(self._id(number), key, value)

    def trial_attrs(self, number: int) -> dict[str, Any]:
        return dict(self.study._storage.get_trial(self._id(number)).user_attrs)

    def report(self, number: int, at: int, value: float) -> None:
        self._trial(number).report(value, at)

    def should_prune(self, number: int) -> bool:
        return self._trial(number).should_prune()

    def tell(self, number: int, value: float | None = None, *, state: str = "complete") -> None:
        states = {"complete": None, "pruned": self.optuna.trial.TrialState.PRUNED,
                  "failed": self.optuna.trial.TrialState.FAIL}
        try:
            self.study.tell(number, value if state == "complete" else None, state=states[state],
                            skip_if_finished=True)
        except RuntimeError as exc:
            # the grid sampler calls study.stop() once its grid is told, which only optimize() allows; the
            # outcome is stored before that (Optuna stores it in a finally), and the conductor asks no more
            if "Study.stop" not in str(exc):
                raise

    def trials(self) -> list[dict[str, Any]]:
        """Each trial as plain data: number, state, params, value, intermediate values, user attrs."""
        return [{"number": t.number, "state": STATES.get(t.state.name, t.state.name.lower()), "params": t.params,
                 "value": t.value if t.state.name == "COMPLETE" else None,
                 "intermediate": {int(k): v for k, v in t.intermediate_values.items()},
                 "attrs": dict(t.user_attrs)} for t in self.study.get_trials(deepcopy=False)]

    def values_at(self, at: int, excluding: int, states: tuple[str, ...]) -> list[float]:
        """The values the other trials in ``states`` reported at ``at``: what a pruner measures a trial against."""
        return [t["intermediate"][at] for t in self.trials()
                if t["number"] != excluding and t["state"] in states and at in t["intermediate"]]


def _storage(optuna, path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    # a reader (sweep show) and the conductor share the file: wait for the other's write rather than fail
    return optuna.storages.RDBStorage(f"sqlite:///{path}", engine_kwargs={"connect_args": {"timeout": 30}})


def exists(path: Path) -> bool:
    return path.is_file()
