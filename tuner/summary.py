"""The end-of-search summary: per problem the best variant against the best baseline."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable, Optional

import optuna
from optuna.trial import TrialState
from rich.table import Table

from tuner.problem import Problem
from tuner.search_study import ATTR_VARIANT, finished_trials
from tuner.store import BaselineRow, Store


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

    @property
    def ratio(self) -> Optional[float]:
        """Best baseline µs / tuned µs: > 1 means the tuned kernel is faster."""
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


def summarize(study: optuna.Study, problem: Problem, store: Store, run_ids: Iterable[int]) -> ProblemSummary:
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    best = min(complete, key=lambda t: (t.value, t.number), default=None)
    baseline = best_baseline(store, problem, run_ids)
    best_us = best.value if best is not None else None
    return ProblemSummary(
        problem=problem,
        study=study.study_name,
        trials=finished_trials(study),
        best_variant=best.user_attrs.get(ATTR_VARIANT) if best is not None else None,
        best_us=best_us,
        best_tflops=problem.tflops(best_us) if best_us else None,
        baseline_impl=baseline.impl if baseline else None,
        baseline_us=baseline.median_us if baseline else None,
    )


def _fmt(value: Optional[float], spec: str) -> str:
    return "-" if value is None else format(value, spec)


def summary_table(rows: list[ProblemSummary], title: str = "search summary") -> Table:
    table = Table(title=title)
    for column, justify in (
        ("problem", "left"), ("trials", "right"), ("best variant", "left"), ("µs", "right"),
        ("TFLOP/s", "right"), ("best baseline", "left"), ("baseline µs", "right"), ("ratio", "right"),
    ):  # fmt: skip
        table.add_column(column, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for row in rows:
        table.add_row(
            row.problem.label,
            str(row.trials),
            row.best_variant or "no ok trial",
            _fmt(row.best_us, ".2f"),
            _fmt(row.best_tflops, ".1f"),
            row.baseline_impl or "-",
            _fmt(row.baseline_us, ".2f"),
            _fmt(row.ratio, ".2f") + ("x" if row.ratio is not None else ""),
        )
    return table
