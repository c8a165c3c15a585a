"""Offline evaluation of search strategies: replay each sampler on a full recording.

    result = evaluate_samplers(EvalOptions(recording="sqlite:///grid.db", samplers=("tpe", "random"), seeds=5))

The recording holds every feasible variant of one problem (`tuner search
--sampler grid` on a GPU), so its fastest ok variant is the true best of the
space. For each (sampler, seed) we run the real search (tuner.search.run.run_search,
replay backend) into a throw-away results store, read back its trials in trial
order, and count the trials it needed to come within X% of that recorded best.

"Trials" are Optuna trials (what --trials budgets): infeasible points and
repeats of an already measured variant count, as they do in a real search.
A run that never gets within X% is "not reached" (infinity in the median).
"""

from __future__ import annotations

import io
import math
import os
import statistics
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable, Optional, Sequence

from tuner.errors import TunerError
from tuner.kernels.feasibility import check
from tuner.reporting.markdown import run_caption
from tuner.reporting.markdown import table as markdown_table
from tuner.problem import Problem, parse_shape
from tuner.profiles import load_profile
from tuner.backends.replay import REPLAYED_STATUSES, is_synthetic_run, newest_measurements
from tuner.search.samplers import SAMPLERS
from tuner.kernels.variant import Variant
from tuner.store import TrialFilter, TrialStatus, open_store

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
    out_dir: Optional[str] = None  # checked (and created) before the evaluation, so a bad --out loses no results


@dataclass(frozen=True)
class Recording:
    """What was recorded: the problem, its card and the true best of its space."""

    url: str
    problem: Problem
    template: str
    profile: str
    gpu_name: str
    run_ids: tuple[int, ...]
    date: str  # of the newest recorded trial (UTC)
    variants: int  # replayable variants (ok or failed measurements)
    best_us: float
    best_variant: str
    synthetic: bool

    @property
    def caption(self) -> str:
        return run_caption(self.gpu_name, self.run_ids, self.date, self.synthetic)


@dataclass(frozen=True)
class SeedRun:
    """One replayed search: best-so-far µs after each trial (None before the first ok one)."""

    sampler: str
    seed: int
    best_so_far: tuple[Optional[float], ...]
    seconds: float

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

    def final_gap_pct(self, best_us: float) -> float:
        """Median over seeds of how far the final best is above the recorded best (%)."""
        finals = [r.best_so_far[-1] if r.best_so_far else None for r in self.runs]
        return statistics.median(math.inf if f is None else (f / best_us - 1) * 100 for f in finals)


@dataclass(frozen=True)
class EvalResult:
    recording: Recording
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
            return (f"best sampler: none (no sampler came within {_pct(max(pcts))} of the recorded best "
                    f"in {self.trials} trials)")
        medians = "; ".join(f"to within {_pct(p)}: {_median_words(best.median(p), self.trials)}" for p in pcts)
        return f"best sampler: {best.sampler} (median trials {medians}; {self.seeds} seeds of {self.trials} trials)"


def _pct(value: float) -> str:
    return f"{value:g}%"


def _median_words(value: float, trials: int) -> str:
    return f"not reached in {trials}" if math.isinf(value) else f"{value:g}"


def fmt_trials(value: float, trials: int) -> str:
    """A trial count; '>N' when not reached within the N trials of a search."""
    return f">{trials}" if math.isinf(value) else f"{value:g}"


# --- the recording ------------------------------------------------------------------------------


def load_recording(url: str, shape: Optional[str] = None) -> Recording:
    """The recorded problem (the one with most replayable variants, or `shape`) and its best ok variant.

    Like the replay backend, the newest measurement of a variant is the one that counts.
    """
    with open_store(url, create=False) as store:
        shape_filter = TrialFilter(shape=parse_shape(shape) if shape is not None else None)
        replayable = [r for r in store.query_trials(shape_filter) if r.status in REPLAYED_STATUSES]
        if not replayable:
            where = f" for shape {shape}" if shape else ""
            raise TunerError(f"the recording at {store.url} holds no replayable trials{where}")
        counts = Counter((r.problem, r.gpu_name) for r in replayable)
        (problem, gpu_name), _ = counts.most_common(1)[0]
        chosen = [r for r in replayable if r.problem == problem and r.gpu_name == gpu_name]
        variants = newest_measurements(chosen)
        ok = [r for r in variants.values() if r.status is TrialStatus.OK and r.median_us is not None]
        if not ok:
            raise TunerError(f"the recording at {store.url} has no ok trial of {problem.label}")
        best = min(ok, key=lambda r: (r.median_us, r.id))
        synthetic = is_synthetic_run(store.trial_detail(best.id).run)
        return Recording(
            url=url, problem=problem, template=best.template, profile=best.profile, gpu_name=gpu_name,
            run_ids=tuple(sorted({r.run_id for r in chosen})), date=max(r.created_at for r in chosen).date().isoformat(),
            variants=len(variants), best_us=float(best.median_us), best_variant=best.variant_name, synthetic=synthetic,
        )  # fmt: skip


# --- one replayed search ------------------------------------------------------------------------


def _shape_of(problem: Problem) -> str:
    return f"{problem.batch},{problem.heads},{problem.seq_q},{problem.seq_k},{problem.head_dim}"


def replay_once(recording: Recording, sampler: str, seed: int, trials: int) -> SeedRun:
    """Run the real search (replay backend) into a temporary store; best-so-far µs by trial number."""
    from rich.console import Console

    from tuner.search.run import SearchOptions, run_search

    p = recording.problem
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tuner-replay-eval-") as tmp:
        db_url = f"sqlite:///{os.path.join(tmp, 'results.db')}"
        options = SearchOptions(
            gpu=recording.profile, shapes=(_shape_of(p),), heads_kv=p.heads_kv, dtype=p.dtype, causal=p.causal,
            layout=p.layout, template=recording.template, trials=trials, sampler=sampler, seed=seed, db_url=db_url,
            backend="replay", replay_from=recording.url, warm_start=0,
        )  # fmt: skip
        report = run_search(options, console=Console(file=io.StringIO()))
        with open_store(db_url, create=False) as store:
            rows = store.query_trials(TrialFilter(study=report.studies[0]))
    # Repeats of a measured variant are told from the store and leave no row: they carry the best forward.
    # Infeasible points cost nothing and are not budgeted trials: the curve skips them.
    by_number: dict[int, float] = {}
    infeasible: set[int] = set()
    profile = load_profile(recording.profile)
    for row in rows:
        if row.trial_number is None:
            continue
        if row.status is TrialStatus.OK and row.median_us is not None:
            by_number[row.trial_number] = min(row.median_us, by_number.get(row.trial_number, math.inf))
        elif row.status is TrialStatus.PRUNED and not check(Variant.from_stored(row.template, row.params),
                                                             row.problem, profile):
            infeasible.add(row.trial_number)
    best: Optional[float] = None
    curve: list[Optional[float]] = []
    for number in range(report.asked + report.infeasible):
        if number in infeasible:
            continue
        if number in by_number and (best is None or by_number[number] < best):
            best = by_number[number]
        curve.append(best)
    return SeedRun(sampler, seed, tuple(curve), time.perf_counter() - start)


def _replay_job(args: tuple[Recording, str, int, int]) -> SeedRun:
    return replay_once(*args)


def _init_worker(threads: int) -> None:
    """GPSampler computes with torch: without this, every worker takes every core and they thrash."""
    import torch

    torch.set_num_threads(threads)


# --- the evaluation -----------------------------------------------------------------------------


def _validate(options: EvalOptions) -> None:
    unknown = [s for s in options.samplers if s not in SAMPLERS]
    if unknown or not options.samplers:
        raise TunerError(f"unknown sampler {', '.join(unknown) or '(none)'}; expected some of {', '.join(SAMPLERS)}")
    if options.seeds < 1 or options.trials < 1:
        raise TunerError("--seeds and --trials must be positive integers")
    if options.jobs is not None and options.jobs < 1:
        raise TunerError("--jobs must be a positive integer")
    if not options.thresholds_pct or any(p <= 0 for p in options.thresholds_pct):
        raise TunerError("thresholds must be positive percentages")


def evaluate_samplers(options: EvalOptions, progress: Optional[Callable[[SeedRun], None]] = None) -> EvalResult:
    """Replay every (sampler, seed) pair, in a process pool when jobs > 1; summarise per sampler."""
    _validate(options)
    if options.out_dir is not None:
        from tuner.reporting.report import ensure_out_dir

        ensure_out_dir(options.out_dir)
    recording = load_recording(options.recording, options.shape)
    pairs = [(recording, s, seed, options.trials) for s in dict.fromkeys(options.samplers) for seed in range(options.seeds)]
    jobs = min(options.jobs or os.cpu_count() or 1, len(pairs))
    runs: list[SeedRun] = []
    if jobs == 1:
        for pair in pairs:
            runs.append(_replay_job(pair))
            if progress:
                progress(runs[-1])
    else:
        import multiprocessing

        # spawn: a fresh interpreter per worker (no forked SQLite handles or Optuna state)
        threads = max(1, (os.cpu_count() or 1) // jobs)
        init = (_init_worker, (threads,)) if "gp" in options.samplers else (None, ())
        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=init[0], initargs=init[1]) as pool:
            for run in pool.map(_replay_job, pairs):
                runs.append(run)
                if progress:
                    progress(run)
    return summarise(recording, runs, options.trials, options.seeds, options.thresholds_pct)


def summarise(recording: Recording, runs: Sequence[SeedRun], trials: int, seeds: int,
              thresholds_pct: tuple[float, ...] = THRESHOLDS_PCT) -> EvalResult:
    summaries = []
    for sampler in dict.fromkeys(r.sampler for r in runs):
        mine = tuple(sorted((r for r in runs if r.sampler == sampler), key=lambda r: r.seed))
        reached = {p: tuple(r.trials_to(recording.best_us * (1 + p / 100)) for r in mine) for p in thresholds_pct}
        summaries.append(SamplerSummary(sampler, mine, reached))
    return EvalResult(recording, trials, seeds, tuple(thresholds_pct), tuple(summaries), datetime.now().astimezone())


# --- output -------------------------------------------------------------------------------------


def _spread_text(s: SamplerSummary, pct: float, trials: int) -> str:
    low, high = s.spread(pct)
    return f"{fmt_trials(low, trials)}–{fmt_trials(high, trials)}"


def table_rows(result: EvalResult) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the per-sampler summary (shared by the rich table and the markdown)."""
    header = ["sampler"]
    for p in result.thresholds_pct:
        header += [f"median to {_pct(p)}", f"range to {_pct(p)}", f"seeds at {_pct(p)}"]
    header += ["final gap", "s/search"]
    rows = []
    for s in result.summaries:
        row = [s.sampler]
        for p in result.thresholds_pct:
            row += [fmt_trials(s.median(p), result.trials), _spread_text(s, p, result.trials),
                    f"{s.hits(p)}/{len(s.runs)}"]
        gap = s.final_gap_pct(result.recording.best_us)
        row += ["-" if math.isinf(gap) else f"{gap:.2f}%", f"{s.seconds:.1f}"]
        rows.append(row)
    return header, rows


def rich_table(result: EvalResult):  # -> rich.table.Table
    from rich.table import Table

    rec = result.recording
    table = Table(title=f"replay evaluation: {rec.problem.label} on {rec.caption}")
    header, rows = table_rows(result)
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i == 0 else "right", no_wrap=i == 0)
    for row in rows:
        table.add_row(*row)
    return table


def markdown(result: EvalResult, plot_name: Optional[str] = None) -> str:
    rec = result.recording
    header, rows = table_rows(result)
    lines = [
        f"# Replay evaluation of search samplers: {rec.problem.label}",
        "",
        f"Recording: {rec.caption}; store {rec.url}.",
        f"Template {rec.template}, {rec.variants} recorded variants; recorded best {rec.best_us:.3f} µs "
        f"({rec.best_variant}).",
        f"Each sampler ran {result.seeds} seeds (0–{result.seeds - 1}) of {result.trials} trials through "
        "`tuner search --backend replay`. A trial is one budgeted Optuna trial: repeats count, "
        "infeasible points (pruned before compiling, free) do not. "
        f"\">{result.trials}\" means not reached within the {result.trials} trials (infinity in the median); "
        "final gap: median over seeds of the last best above the recorded best.",
        f"Generated {result.generated_at:%Y-%m-%d %H:%M %Z}.",
        "",
        *markdown_table(header, rows),
        f"**{result.best_line()}**",
        "",
    ]
    if plot_name:
        lines += [f"![replay evaluation]({plot_name})", "",
                  f"*Figure: gap to the recorded best by trial, and trials to within "
                  f"{_pct(result.thresholds_pct[0])} per seed. {rec.caption}.*", ""]
    return "\n".join(lines)


CSV_FIELDS = ("sampler", "seed", "trials", "seconds", "final_best_us", "recorded_best_us")


def write_csv(result: EvalResult, path: str) -> None:
    """One row per (sampler, seed): trials to within each threshold (empty = not reached)."""
    import csv

    pct_fields = [f"trials_to_{p:g}pct" for p in result.thresholds_pct]
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow([*CSV_FIELDS, *pct_fields])
        for s in result.summaries:
            for i, run in enumerate(s.runs):
                final = run.best_so_far[-1] if run.best_so_far else None
                reached = ["" if s.reached[p][i] is None else s.reached[p][i] for p in result.thresholds_pct]
                writer.writerow([s.sampler, run.seed, len(run.best_so_far), f"{run.seconds:.3f}",
                                 "" if final is None else repr(final), repr(result.recording.best_us), *reached])


@dataclass(frozen=True)
class EvalFiles:
    markdown: str
    csv: str
    plot: str


def write_outputs(result: EvalResult, out_dir: str) -> EvalFiles:
    from tuner.reporting.plots import plot_replay_eval
    from tuner.reporting.report import ensure_out_dir, os_error_text

    ensure_out_dir(out_dir)
    files = EvalFiles(*(os.path.join(out_dir, n) for n in ("replay_eval.md", "replay_eval.csv", "replay_eval.png")))
    try:
        plot_replay_eval(result, files.plot)
        write_csv(result, files.csv)
        with open(files.markdown, "w") as handle:
            handle.write(markdown(result, os.path.basename(files.plot)))
    except OSError as exc:  # one line, not a traceback
        raise TunerError(os_error_text(exc, out_dir)) from None
    return files
