"""Offline evaluation of search strategies: replay each sampler on a full recording.

    result = evaluate_samplers(EvalOptions(recording="sqlite:///grid.db", samplers=("tpe", "random"), seeds=5))

The recording holds every feasible variant of one problem (`tuner search
--sampler grid` on a GPU), so its fastest ok variant is the true best of the
space. For each (sampler, seed) we run the real search (tuner.search.run.run_search,
replay backend) into a throw-away results store, read back its trials in trial
order, and count the trials it needed to come within X% of that recorded best.

"Trials" are budgeted trials (what --trials counts): distinct feasible
variants; infeasible points and repeats of a point the study holds are free,
as they are in a real search.
A run that never gets within X% is "not reached" (infinity in the median).
"""

from __future__ import annotations

import io
import math
import multiprocessing
import os
import statistics
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime
from typing import Callable, Optional, Sequence

from rich.console import Console

from tuner.backends.replay import NOT_RECORDED, REPLAYED_STATUSES, is_synthetic_run, recorded_measurements
from tuner.errors import TunerError
from tuner.kernels.feasibility import check
from tuner.kernels.variant import Variant
from tuner.problem import Problem, parse_shape
from tuner.profiles import load_profile
from tuner.reporting.files import ensure_out_dir
from tuner.reporting.replay_eval_model import (
    THRESHOLDS_PCT,
    EvalOptions,
    EvalResult,
    GridRecording,
    SamplerSummary,
    SeedRun,
)  # fmt: skip
from tuner.search.options import SearchOptions
from tuner.search.run import run_search
from tuner.search.samplers import SAMPLERS
from tuner.status import TrialStatus
from tuner.store import TrialFilter, open_store


def load_recording(url: str, shape: Optional[str] = None) -> GridRecording:
    """The recorded problem (the one with most replayable variants, or `shape`) and its best ok variant.

    A variant's true time is the median of its recorded timings (one, or several where the recording
    timed it repeatedly); the replay backend draws among them as a GPU's noise would.
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
        variants = recorded_measurements(chosen)
        true_us = {rows[0].variant_name: statistics.median(r.median_us for r in ok) for rows in variants.values()
                   if (ok := [r for r in rows if r.status is TrialStatus.OK and r.median_us is not None])}
        if not true_us:
            raise TunerError(f"the recording at {store.url} has no ok trial of {problem.label}")
        best_variant = min(true_us, key=lambda name: (true_us[name], name))
        first = next(rows[0] for rows in variants.values() if rows[0].variant_name == best_variant)
        synthetic = is_synthetic_run(store.trial_detail(first.id).run)
        return GridRecording(
            url=url, problem=problem, template=first.template, profile=first.profile, gpu_name=gpu_name,
            run_ids=tuple(sorted({r.run_id for r in chosen})), date=max(r.created_at for r in chosen).date().isoformat(),
            variants=len(variants), best_us=float(true_us[best_variant]), best_variant=best_variant,
            synthetic=synthetic, true_us=true_us, timings=max(len(rows) for rows in variants.values()),
        )  # fmt: skip


# --- one replayed search ------------------------------------------------------------------------


def _shape_of(problem: Problem) -> str:
    return f"{problem.batch},{problem.heads},{problem.seq_q},{problem.seq_k},{problem.head_dim}"


def replay_once(recording: GridRecording, sampler: str, seed: int, trials: int,
                early_stop: Optional[int] = None) -> SeedRun:
    """Run the real search (replay backend) into a temporary store; best-so-far µs by trial number."""
    p = recording.problem
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tuner-replay-eval-") as tmp:
        db_url = f"sqlite:///{os.path.join(tmp, 'results.db')}"
        options = SearchOptions(
            gpu=recording.profile, shapes=(_shape_of(p),), heads_kv=p.heads_kv, dtype=p.dtype, causal=p.causal,
            layout=p.layout, lengths=p.lengths, window=(p.window_left, p.window_right), softcap=p.softcap,
            template=recording.template, trials=trials, sampler=sampler, seed=seed, db_url=db_url,
            backend="replay", replay_from=recording.url, warm_start=0, early_stop=early_stop,
            kernel_pass=p.kernel_pass,
        )  # fmt: skip
        report = run_search(options, console=Console(file=io.StringIO()))
        with open_store(db_url, create=False) as store:
            rows = store.query_trials(TrialFilter(study=report.studies[0]))
            confirmed = store.confirmed(p)
    # Infeasible points, points the recording does not hold and repeats of a point the study held cost
    # nothing and are not budgeted trials (a repeat leaves no row): the curve has one step per budgeted trial.
    by_number: dict[int, tuple[float, str]] = {}
    free: set[int] = set()
    profile = load_profile(recording.profile)
    for row in rows:
        if row.trial_number is None:
            continue
        if row.status is TrialStatus.OK and row.median_us is not None:
            by_number[row.trial_number] = min((row.median_us, row.variant_name),
                                              by_number.get(row.trial_number, (math.inf, "")))
        elif row.status is TrialStatus.PRUNED and (row.error == NOT_RECORDED or not check(
                Variant.from_stored(row.template, row.params), row.problem, profile)):
            free.add(row.trial_number)
    stored = {row.trial_number for row in rows}
    seen: Optional[tuple[float, str]] = None  # the fastest measurement so far: (µs as measured, variant)
    curve: list[Optional[float]] = []
    for number in range(report.asked + report.infeasible + report.repeated):
        if number in free or number not in stored:
            continue
        if number in by_number and (seen is None or by_number[number] < seen):
            seen = by_number[number]
        curve.append(None if seen is None else recording.true_us.get(seen[1], seen[0]))
    return SeedRun(sampler, seed, tuple(curve), time.perf_counter() - start,
                   regret_pct=_regret(recording, seen[1] if seen else None),
                   confirmed_regret_pct=_regret(recording, confirmed.variant_name if confirmed else None))


def _regret(recording: GridRecording, variant: Optional[str]) -> Optional[float]:
    """How far the variant's true time is above the recorded best, in %."""
    if variant is None or variant not in recording.true_us:
        return None
    return (recording.true_us[variant] / recording.best_us - 1) * 100


def _replay_job(args: tuple[GridRecording, str, int, int, Optional[int]]) -> SeedRun:
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
    if options.early_stop is not None and options.early_stop < 1:
        raise TunerError("--early-stop must be a positive number of trials")
    if options.jobs is not None and options.jobs < 1:
        raise TunerError("--jobs must be a positive integer")
    if not options.thresholds_pct or any(p <= 0 for p in options.thresholds_pct):
        raise TunerError("thresholds must be positive percentages")


def evaluate_samplers(options: EvalOptions, progress: Optional[Callable[[SeedRun], None]] = None) -> EvalResult:
    """Replay every (sampler, seed) pair, in a process pool when jobs > 1; summarise per sampler."""
    _validate(options)
    if options.out_dir is not None:
        ensure_out_dir(options.out_dir)
    recording = load_recording(options.recording, options.shape)
    pairs = [(recording, s, seed, options.trials, options.early_stop) for s in dict.fromkeys(options.samplers) for seed in range(options.seeds)]
    jobs = min(options.jobs or os.cpu_count() or 1, len(pairs))
    runs: list[SeedRun] = []
    if jobs == 1:
        for pair in pairs:
            runs.append(_replay_job(pair))
            if progress:
                progress(runs[-1])
    else:
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


def summarise(recording: GridRecording, runs: Sequence[SeedRun], trials: int, seeds: int,
              thresholds_pct: tuple[float, ...] = THRESHOLDS_PCT) -> EvalResult:
    summaries = []
    for sampler in dict.fromkeys(r.sampler for r in runs):
        mine = tuple(sorted((r for r in runs if r.sampler == sampler), key=lambda r: r.seed))
        reached = {p: tuple(r.trials_to(recording.best_us * (1 + p / 100)) for r in mine) for p in thresholds_pct}
        summaries.append(SamplerSummary(sampler, mine, reached))
    return EvalResult(recording, trials, seeds, tuple(thresholds_pct), tuple(summaries), datetime.now().astimezone())



