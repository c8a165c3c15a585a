"""The data of a replay evaluation: options, the recording, one replayed search, per-sampler summaries."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from datetime import datetime
from typing import Optional

from tuner.problem import Problem
from tuner.reporting.markdown import run_caption

DEFAULT_SAMPLERS = ("tpe", "gp", "cmaes", "random")
DEFAULT_SEEDS = 5
DEFAULT_TRIALS = 100  # per (sampler, seed): GP's per-trial cost grows with the trial count
THRESHOLDS_PCT = (1.0, 3.0)



@dataclass(frozen=True)
class EvalOptions:
    recording: str  # results-store URL of the recording
    samplers: tuple[str, ...] = DEFAULT_SAMPLERS
    seeds: int = DEFAULT_SEEDS  # seeds 0 .. seeds-1
    trials: int = DEFAULT_TRIALS
    shape: Optional[str] = None  # B,H,S,D: which recorded problem (default: the one with most variants)
    jobs: Optional[int] = None  # worker processes (default: CPU count; 1 runs in this process)
    thresholds_pct: tuple[float, ...] = THRESHOLDS_PCT
    early_stop: Optional[int] = None  # the searches' --early-stop (None: each runs its full --trials)
    out_dir: Optional[str] = None  # checked (and created) before the evaluation, so a bad --out loses no results


@dataclass(frozen=True)
class GridRecording:
    """What was recorded: the problem, its card and the true best of its space."""

    url: str
    problem: Problem
    template: str
    profile: str
    gpu_name: str
    run_ids: tuple[int, ...]
    date: str  # of the newest recorded trial (UTC)
    variants: int  # replayable variants (ok or failed measurements)
    best_us: float  # the best true time: a variant's true time is the median of its recorded timings
    best_variant: str
    synthetic: bool
    true_us: dict[str, float] = field(default_factory=dict)  # variant name -> true time (ok variants)
    timings: int = 1  # most timings recorded for one variant (1: a noiseless replay)

    @property
    def caption(self) -> str:
        return run_caption(self.gpu_name, self.run_ids, self.date, self.synthetic)


@dataclass(frozen=True)
class SeedRun:
    """One replayed search: after each trial, the true time of the variant it had measured fastest so
    far (None before the first ok one); and the regret of its pick, in % above the recorded best:
    the in-search best's (no confirm stage), and the confirm stage's winner's."""

    sampler: str
    seed: int
    best_so_far: tuple[Optional[float], ...]
    seconds: float
    regret_pct: Optional[float] = None
    confirmed_regret_pct: Optional[float] = None

    def trials_to(self, target_us: float) -> Optional[int]:
        """1-based number of the first trial whose best-so-far is <= target_us, or None (not reached)."""
        for n, best in enumerate(self.best_so_far, start=1):
            if best is not None and best <= target_us:
                return n
        return None


@dataclass(frozen=True)
class SamplerSummary:
    sampler: str
    runs: tuple[SeedRun, ...]
    # per threshold: trials of each seed (None = not reached), in seed order
    reached: dict[float, tuple[Optional[int], ...]] = field(default_factory=dict)

    def median(self, pct: float) -> float:
        """Median trials to within pct over the seeds; a seed that never got there counts as infinity."""
        return statistics.median(math.inf if n is None else n for n in self.reached[pct])

    def spread(self, pct: float) -> tuple[float, float]:
        values = [math.inf if n is None else n for n in self.reached[pct]]
        return min(values), max(values)

    def hits(self, pct: float) -> int:
        return sum(n is not None for n in self.reached[pct])

    @property
    def seconds(self) -> float:
        return statistics.mean(r.seconds for r in self.runs)

    def median_regret(self, confirmed: bool) -> Optional[float]:
        """Median over seeds of the picked variant's regret (%); None when no seed picked one."""
        values = [r.confirmed_regret_pct if confirmed else r.regret_pct for r in self.runs]
        known = [v for v in values if v is not None]
        return statistics.median(known) if known else None

    def final_gappct_text(self, best_us: float) -> float:
        """Median over seeds of how far the final best is above the recorded best (%)."""
        finals = [r.best_so_far[-1] if r.best_so_far else None for r in self.runs]
        return statistics.median(math.inf if f is None else (f / best_us - 1) * 100 for f in finals)


@dataclass(frozen=True)
class EvalResult:
    recording: GridRecording
    trials: int
    seeds: int
    thresholds_pct: tuple[float, ...]
    summaries: tuple[SamplerSummary, ...]
    generated_at: datetime

    @property
    def best(self) -> Optional[SamplerSummary]:
        """Fewest median trials to the tightest threshold, ties broken by the next ones; None if none got there."""
        key = lambda s: tuple(s.median(p) for p in self.thresholds_pct) + (s.sampler,)  # noqa: E731
        ranked = sorted(self.summaries, key=key)
        if not ranked or all(math.isinf(v) for v in key(ranked[0])[:-1]):
            return None
        return ranked[0]

    def best_line(self) -> str:
        best, pcts = self.best, self.thresholds_pct
        if best is None:
            return (f"best sampler: none (no sampler came within {pct_text(max(pcts))} of the recorded best "
                    f"in {self.trials} trials)")
        medians = "; ".join(f"to within {pct_text(p)}: {median_words(best.median(p), self.trials)}" for p in pcts)
        return f"best sampler: {best.sampler} (median trials {medians}; {self.seeds} seeds of {self.trials} trials)"


def pct_text(value: float) -> str:
    return f"{value:g}%"


def median_words(value: float, trials: int) -> str:
    return f"not reached in {trials}" if math.isinf(value) else f"{value:g}"


def fmt_trials(value: float, trials: int) -> str:
    """A trial count; '>N' when not reached within the N trials of a search."""
    return f">{trials}" if math.isinf(value) else f"{value:g}"
