"""TPE that weighs its candidates among the points worth asking (AdmissibleTPESampler).

Optuna's TPE draws 24 candidates from its model of the good region and returns the one it rates best, whether the
kernel would fit the problem or not, and whether the study measured it already. Most of a prefill study's asks were
therefore wasted: at qwen2.5-7b's prefill problems 4.4 asks a measured trial (1.9 infeasible points, 1.5 repeats;
NOTES, session 25, call 6), each a full sample over all the study's trials (17 ms on the H200 host). Here the
candidates that are infeasible or held are rated out before the pick, so an ask gives a new feasible point unless
every candidate is out, again after MORE_DRAWS more batches (then TPE's own pick stands and the search loop handles
it as before: told pruned, or answered from the store). The first trials (TPE's random start-up) are drawn from the admissible points alike.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.samplers._tpe.parzen_estimator import _ParzenEstimator
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

# A trial in these states holds its point: a measured, pruned (infeasible) or running (asked ahead) one.
HOLDING = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
MORE_DRAWS = 3  # batches of candidates drawn again when none of a batch is admissible


class AdmissibleSpace:
    """The feasible points of one problem as tuples of internal representations (category indices) over `names`, the
    parameters with more than one value (the others are in no sample), sorted; listed at the first need."""

    def __init__(self, distributions: dict[str, CategoricalDistribution], points: Callable[[], Iterable[dict]]):
        self.distributions = distributions
        self.names = tuple(sorted(n for n, d in distributions.items() if not d.single()))
        self._points = points
        self._feasible: Optional[set[tuple[int, ...]]] = None

    def _key(self, params: dict[str, Any]) -> Optional[tuple[int, ...]]:
        try:
            return tuple(int(self.distributions[n].to_internal_repr(params[n])) for n in self.names)
        except (KeyError, ValueError):  # a point of another manifest revision (a warm start, a resume)
            return None

    def feasible(self) -> set[tuple[int, ...]]:
        if self._feasible is None:
            self._feasible = {k for p in self._points() if (k := self._key(p)) is not None}
        return self._feasible

    def held(self, trials: Iterable[FrozenTrial]) -> set[tuple[int, ...]]:
        return {k for t in trials if t.state in HOLDING and (k := self._key(t.params)) is not None}


class AdmissibleTPESampler(optuna.samplers.TPESampler):
    """Multivariate TPE (constant liar) whose pick is made among the feasible points the study does not hold, once
    `restrict` has given it the problem's space; unrestricted it is Optuna's TPESampler."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._space: Optional[AdmissibleSpace] = None
        self._study: Optional[Study] = None  # the study of the sample being made (sample_relative sets it)
        self.rated_out = 0  # picks the restriction changed (a test and the notes count them)

    def restrict(self, space: AdmissibleSpace) -> None:
        self._space = space

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        if self._space is None:
            return super().infer_relative_search_space(study, trial)
        # Every trial has every parameter: the whole space from the first trial on, so the start-up is relative too.
        return {n: d for n, d in self._space.distributions.items() if n in self._space.names}  # the manifest's order

    def sample_relative(self, study: Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        self._study = study
        if self._space is not None and search_space:
            told = study._get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED), use_cache=True)
            if len(told) < self._n_startup_trials:  # TPE's random start-up, over the admissible points
                return self._random_admissible(study, search_space) or super().sample_relative(study, trial, search_space)
        return super().sample_relative(study, trial, search_space)

    def _random_admissible(self, study: Study, search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        """A start-up point, at random among the open points (search_space: infer_relative_search_space's)."""
        assert self._space is not None
        open_ = sorted(self._space.feasible() - self._space.held(study.get_trials(deepcopy=False)))
        if not open_:
            return {}
        key = open_[int(self._rng.rng.randint(len(open_)))]
        return {n: search_space[n].to_external_repr(k) for n, k in zip(self._space.names, key)}

    def _compute_acquisition_func(self, samples: dict[str, np.ndarray], mpe_below: _ParzenEstimator,
                                  mpe_above: _ParzenEstimator) -> np.ndarray:
        values = super()._compute_acquisition_func(samples, mpe_below, mpe_above)
        if self._space is None or self._study is None or set(samples) != set(self._space.names):
            return values  # an independent sample of one parameter: nothing to rate out
        names = self._space.names
        feasible = self._space.feasible()
        held = self._space.held(self._study.get_trials(deepcopy=False))
        admissible = self._admissible(samples, names, feasible, held)
        for _ in range(MORE_DRAWS):
            if admissible.any():
                break
            # Every candidate is out (a converged model proposes held points): more candidates from the same model.
            # TPESampler._sample compares the candidates of this dict, so they are added to it in place.
            more = mpe_below.sample(self._rng.rng, self._n_ei_candidates)
            for n in samples:
                samples[n] = np.concatenate([samples[n], more[n]])
            values = np.concatenate([values, super()._compute_acquisition_func(more, mpe_below, mpe_above)])
            admissible = self._admissible(samples, names, feasible, held)
        if not admissible.any():
            return values  # still none: TPE's own pick (the search loop answers a repeat from the store)
        if not admissible[int(np.argmax(values))]:
            self.rated_out += 1
        return np.where(admissible, values, -np.inf)

    @staticmethod
    def _admissible(samples: dict[str, np.ndarray], names: tuple[str, ...], feasible: set[tuple[int, ...]],
                    held: set[tuple[int, ...]]) -> np.ndarray:
        keys = zip(*(samples[n].astype(int).tolist() for n in names))
        count = next(iter(samples.values())).size
        return np.fromiter((k in feasible and k not in held for k in keys), dtype=bool, count=count)



def restrict(sampler: optuna.samplers.BaseSampler, distributions: dict[str, CategoricalDistribution],
             points: Callable[[], Iterable[dict]]) -> None:
    """Restrict an AdmissibleTPESampler to a problem's feasible `points` (other samplers are left as they are)."""
    if isinstance(sampler, AdmissibleTPESampler):
        sampler.restrict(AdmissibleSpace(distributions, points))
