"""The end-of-search summary: per problem the best variant against the best baseline."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Optional

import optuna
from optuna.trial import TrialState

from tuner.errors import TunerError
from tuner.problem import Problem
from tuner.runtime.objective import TIME
from tuner.search.study import ATTR_OBJECTIVE, ATTR_STORE_ID, ATTR_VARIANT, finished_trials
from tuner.status import TrialStatus
from tuner.store import BaselineRow, Store, TrialFilter, TrialRow


@dataclass(frozen=True)
class ProblemSummary:
    problem: Problem
    study: str
    trials: int  # finished trials of the study (this and earlier invocations)
    best_variant: Optional[str]
    best_us: Optional[float]
    best_tflops: Optional[float]
    baseline_impl: Optional[str]
    baseline_us: Optional[float]
    confirmed_ratio: Optional[float] = None  # set when the figures are the confirm stage's (median per-round ratio)
    objective: str = TIME  # what the study minimized; with energy the confirmed ratio compares J per call

    @property
    def confirmed(self) -> bool:
        return self.confirmed_ratio is not None

    @property
    def ratio(self) -> Optional[float]:
        """Best baseline µs / tuned µs: > 1 means the tuned kernel is faster (the confirm stage's median
        per-round ratio when there is one)."""
        if self.confirmed_ratio is not None:
            return self.confirmed_ratio
        if self.best_us and self.baseline_us:
            return self.baseline_us / self.best_us
        return None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["problem"] = self.problem.label
        out["ratio"] = self.ratio
        return out


def best_baseline(store: Store, problem: Problem, run_ids: Iterable[int]) -> Optional[BaselineRow]:
    """The fastest baseline of `problem` among the given runs (timed on the cards of this search)."""
    problem_id = store.problem_id(problem)
    rows = [b for run_id in run_ids for b in store.baselines_for(run_id, problem_id)]
    return min(rows, key=lambda b: b.median_us, default=None)


def _stored_row(store: Store, problem: Problem, variant: Optional[str], median_us: Optional[float]) -> Optional[TrialRow]:
    """The stored ok measurement behind the study's best value (it may come from an earlier run)."""
    if variant is None or median_us is None:
        return None
    rows = store.query_trials(TrialFilter(problem=problem, status=TrialStatus.OK))
    rows = [r for r in rows if r.variant_name == variant]
    return min(rows, key=lambda r: abs((r.median_us or 0.0) - median_us), default=None)


def _row_of(store: Store, trial: Optional[optuna.trial.FrozenTrial]) -> Optional[TrialRow]:
    """The stored row an Optuna trial was told from (its value is not µs under another objective)."""
    store_id = trial.user_attrs.get(ATTR_STORE_ID) if trial is not None else None
    try:
        return store.trial_detail(int(store_id)) if store_id is not None else None
    except TunerError:
        return None


def summarize(study: optuna.Study, problem: Problem, store: Store, run_ids: Iterable[int]) -> ProblemSummary:
    """The study's best; the confirm stage's winner and figures when one of these runs confirmed it."""
    run_ids = list(run_ids)
    objective = study.user_attrs.get(ATTR_OBJECTIVE, TIME)
    confirmed = store.confirmed(problem)
    if confirmed is not None and confirmed.run_id in run_ids and confirmed.ratio is not None:
        timings = store.confirm_timings(confirmed.confirmation_id)
        baseline_us = statistics.median(timings[confirmed.baseline_impl]) if confirmed.baseline_impl else None
        return ProblemSummary(problem, study.study_name, finished_trials(study), confirmed.variant_name,
                              confirmed.median_us, problem.tflops(confirmed.median_us), confirmed.baseline_impl,
                              baseline_us, confirmed_ratio=confirmed.ratio, objective=confirmed.objective)
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    best = min(complete, key=lambda t: (t.value, t.number), default=None)
    # Compare with the baselines of the run that measured the best trial (same process and
    # card); a best served from the store was measured, with its baselines, in an earlier run.
    if objective == TIME:
        best_us = best.value if best is not None else None
        row = _stored_row(store, problem, best.user_attrs.get(ATTR_VARIANT) if best else None, best_us)
    else:  # the study's values are J per call or isolated µs: the figures shown are the stored row's
        row = _row_of(store, best)
        best_us = row.median_us if row is not None else None
    if row is not None and row.best_baseline_us is not None:
        baseline_impl, baseline_us = row.best_baseline_impl, row.best_baseline_us
    else:
        fastest = best_baseline(store, problem, run_ids)
        baseline_impl, baseline_us = (fastest.impl, fastest.median_us) if fastest else (None, None)
    return ProblemSummary(
        problem=problem,
        study=study.study_name,
        trials=finished_trials(study),
        best_variant=best.user_attrs.get(ATTR_VARIANT) if best is not None else None,
        best_us=best_us,
        best_tflops=problem.tflops(best_us) if best_us else None,
        baseline_impl=baseline_impl,
        baseline_us=baseline_us,
        objective=objective,
    )
