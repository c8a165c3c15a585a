"""What the benchmark report holds: its data types, gathered by tuner.reporting.report."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Optional

from tuner.problem import Problem
from tuner.reporting.markdown import run_caption
from tuner.runtime.energy import Energy
from tuner.runtime.timed import Timed, Timing
from tuner.search.samplers import problem_key
from tuner.store import NcuMetric, TrialRow

# Shown first, in this order; other baselines follow alphabetically.
BASELINE_ORDER = ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "fa4", "triton_fa2")
TUNED = "tuned"
MIN_IMPORTANCE_TRIALS = 10  # fewer complete trials give importances that are noise



@dataclass(frozen=True)
class RunLabel:
    """Which card and run produced a number."""

    gpu_name: str
    run_ids: tuple[int, ...]
    date: str  # UTC date the run started
    synthetic: bool = False
    replayed_from: Optional[str] = None  # the recording a replayed run answered from

    @property
    def caption(self) -> str:
        return run_caption(self.gpu_name, self.run_ids, self.date, self.synthetic, self.replayed_from is not None)


@dataclass(frozen=True)
class RunFacts:
    """One row of the report's run table: where and with what a run measured."""

    run_id: int
    gpu_name: str
    started_at: Optional[datetime]
    host: Optional[str]
    driver: Optional[str]
    cuda_version: Optional[str]
    torch_version: Optional[str]
    tuner_version: Optional[str]
    command_line: Optional[str]


@dataclass(frozen=True)
class ImplTiming(Timed):
    """One implementation's timing on a problem: the tuned kernel or a baseline of its run."""

    impl: str  # TUNED or a baseline name
    timing: Timing
    tflops: Optional[float]
    # The median Energy of its rounds in the confirm stage that re-timed the tuned kernel: a search times its
    # trials and baselines without the energy meter (unless it minimizes energy), its confirm stage with it.
    confirm_energy: Optional[Energy] = None

    @property
    def shown_energy(self) -> Optional[Energy]:
        """Its timing's energy, else the confirm stage's (None: neither was metered)."""
        return self.timing.energy if self.timing.energy is not None else self.confirm_energy

    @property
    def joules_per_call(self) -> Optional[float]:
        return self.shown_energy.joules_per_call if self.shown_energy else None

    @property
    def power_w(self) -> Optional[float]:
        return self.shown_energy.power_w if self.shown_energy else None

    @property
    def tflops_per_watt(self) -> Optional[float]:
        return self.tflops / self.power_w if self.tflops is not None and self.power_w else None


@dataclass(frozen=True)
class StudyCurve:
    """Best-so-far µs of one study, by trial number and by seconds since its run started."""

    study: str
    run_ids: tuple[int, ...]
    trial_numbers: tuple[int, ...]
    best_by_number: tuple[float, ...]
    elapsed_s: tuple[float, ...]
    best_by_time: tuple[float, ...]
    trials: int  # stored trials of the study (any status)


@dataclass(frozen=True)
class Importance:
    study: str
    values: dict[str, float]  # empty when unavailable (see note)
    evaluator: str = ""
    note: str = ""


@dataclass(frozen=True)
class ConfirmedVariant:
    """One variant of a confirm stage: its in-search time beside its interleaved re-timing."""

    name: str
    in_search_us: Optional[float]
    confirmed_us: float  # median over the rounds it ran
    ratio: Optional[float]  # median per-round ratio to the stage's fastest baseline
    rounds: int = 0  # rounds it ran (fewer than the stage's: stopped early as clearly slower)
    joules_per_call: Optional[float] = None  # median over the rounds that measured energy


@dataclass(frozen=True)
class ConfirmSection:
    run_id: int
    rounds: int
    baseline_impl: Optional[str]
    winner: str
    variants: tuple[ConfirmedVariant, ...]
    objective: str = "time"  # what the winner was ranked by


@dataclass(frozen=True)
class ProblemReport:
    problem: Problem
    best: TrialRow
    label: RunLabel
    timings: tuple[ImplTiming, ...]  # tuned first, then the run's baselines
    curves: tuple[StudyCurve, ...] = ()
    importances: tuple[Importance, ...] = ()
    ncu: tuple[NcuMetric, ...] = ()
    confirm: Optional[ConfirmSection] = None

    @property
    def key(self) -> str:
        return f"{self.best.profile}-{problem_key(self.problem)}"

    @property
    def curves_label(self) -> RunLabel:
        """The label with the runs of this problem's studies (they may span several runs)."""
        return replace(self.label, run_ids=tuple(sorted({r for c in self.curves for r in c.run_ids})))

    @property
    def ratios(self) -> dict[str, float]:
        """Baseline µs / tuned µs per baseline: > 1 means the tuned kernel is faster."""
        tuned = self.best.median_us
        return {t.impl: t.median_us / tuned for t in self.timings if t.impl != TUNED and tuned}


@dataclass(frozen=True)
class BenchmarkReport:
    gpu: str
    db_url: str  # password hidden
    generated_at: datetime
    problems: tuple[ProblemReport, ...]
    run_id: Optional[int] = None
    runs: tuple[RunFacts, ...] = ()

    @property
    def baseline_impls(self) -> list[str]:
        found = {t.impl for p in self.problems for t in p.timings if t.impl != TUNED}
        return [i for i in BASELINE_ORDER if i in found] + sorted(found - set(BASELINE_ORDER))

    @property
    def gpu_names(self) -> list[str]:
        return sorted({p.label.gpu_name for p in self.problems})

    @property
    def synthetic(self) -> bool:
        return any(p.label.synthetic for p in self.problems)

    @property
    def replayed_from(self) -> list[str]:
        """The recordings that replayed runs of this report answered from."""
        return sorted({p.label.replayed_from for p in self.problems if p.label.replayed_from})


@dataclass(frozen=True)
class ReportFiles:
    markdown: str
    json: str
    figures: list[str] = field(default_factory=list)
