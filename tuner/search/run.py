"""The search: Optuna ask/tell over a template's space, one trial at a time into the store.

    report = run_search(SearchOptions(gpu="h100", shapes=("16,16,2048,64",), trials=200))

This module holds the entry points (run_search; run_join, behind `tuner worker`)
and their report (the options are tuner.search.options); the work is split over:

- tuner.search.prepare  problems, studies (create or --resume), budgets, warm start;
- tuner.search.workers  one worker per device, in this process or in child processes; Ctrl-C;
- tuner.search.loop     the ask/tell loop of one study on one worker (ProblemSearch);
- tuner.search.hooks    the backends (`gpu`, `replay`), the kernel builder and the clock a worker calls
                        (`hooks=` replaces them for one search in this process, as tests do).

Ctrl-C: the first stops after the current trial (everything measured stays
stored; the summary prints; the CLI exits 130), a second one aborts.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from rich.console import Console

from tuner.backends.gpu_process import started_early
from tuner.backends.replay import check_recorded, check_recording_objective, recorded_problems, recording_profile
from tuner.errors import TunerError
from tuner.kernels.feasibility import tunes_problem
from tuner.kernels.manifest import load_manifest
from tuner.problem import BACKWARD, FORWARD, Problem
from tuner.profiles import GpuProfile, load_profile, resolve_profile
from tuner.runtime.baselines import missing_baselines_note
from tuner.search.hooks import Hooks, check_backend, require_gpus
from tuner.search.job import WorkerJob, WorkerResult
from tuner.search.options import BOTH, SearchOptions, validate_options
from tuner.search.prepare import (choose_template, default_problems, prepare_study, problems_of, shape_problems,
                                  study_name_for)
from tuner.search.progress import SearchProgress
from tuner.search.study import finished_trials, load_study, opened_storage, results_url_for, study_info
from tuner.search.summary import ProblemSummary, summarize
from tuner.search.time_share import split_line
from tuner.search.worker_entry import StartedWorkers
from tuner.search.worker_processes import run_processes, started_workers
from tuner.search.workers import WorkerSpec, run_here
from tuner.store import Store, default_db_url, open_store


@dataclass(frozen=True)
class SearchReport:
    summaries: list[ProblemSummary]
    run_ids: list[int]
    studies: list[str]
    interrupted: bool
    measured: int
    reused: int  # measured by an earlier run, served from the store
    asked: int  # feasible points (the --trials budget)
    infeasible: int = 0  # points pruned by the feasibility rules, not budgeted
    repeated: int = 0  # proposals of a point the study already held (free)
    exhausted: tuple[str, ...] = ()  # studies whose sampler kept proposing points they held
    stopped_early: tuple[tuple[str, int], ...] = ()  # (study, budgeted trials it held) ended by --early-stop
    seconds: tuple[tuple[str, float], ...] = ()  # the workers' time by phase, summed
    search_seconds: tuple[tuple[str, float], ...] = ()  # this process's own phases around the workers
    untuned: tuple[str, ...] = ()  # studies no worker started: the --time-budget was spent
    wall_s: float = 0.0
    workers: int = 1  # worker processes (cards) the search ran on


def _printer(console: Console) -> Callable[[str], None]:
    return lambda text: console.print(text, markup=False, highlight=False, soft_wrap=True)


def _resolve(options: SearchOptions) -> GpuProfile:
    if options.backend == "replay":
        check_recording_objective(options.replay_from, options.objective)  # before any study is created
        return recording_profile(options.replay_from) if options.gpu.strip().lower() == "auto" else load_profile(options.gpu)
    if options.gpu.strip().lower() != "auto":
        load_profile(options.gpu)  # an unknown profile is named as such, GPU or not
    require_gpus(options.devices)
    return resolve_profile(options.gpu, force=options.force, device=options.devices[0])


def _recorded(options: SearchOptions, profile: GpuProfile, hooks: Hooks) -> Optional[list[Problem]]:
    """A replay: the problems its recording holds, once each --shape problem is among them (else a
    one-line error before any store is opened: a replay of it would only prune every point)."""
    if options.backend != "replay" or hooks.replaced:  # replaced hooks answer from elsewhere (tests)
        return None
    if options.shapes:  # a problem no template can tune says so first: a recording holding it is moot
        _check_tunable(options, profile)
    recorded = recorded_problems(options.replay_from, profile, options.force)
    check_recorded(options.replay_from, profile, shape_problems(options) if options.shapes else [], recorded)
    if not options.shapes and not any(p in recorded for p in default_problems(options, profile)):
        check_recorded(options.replay_from, profile, default_problems(options, profile), recorded)
    return recorded


def _check_tunable(options: SearchOptions, profile: GpuProfile) -> None:
    """The one-line 'cannot tune' error problems_of gives, for a --shape problem that neither --template nor
    any of the profile's templates supports (the most general template's reason)."""
    templates = [options.template] if options.template else list(profile.templates_for(options.kernel_pass))
    for problem in shape_problems(options):
        reasons = [tunes_problem(load_manifest(t), problem) for t in templates]
        if all(reasons):
            raise TunerError(f"cannot tune {problem.label}: {reasons[-1]}")


def _run_ids(results: list[WorkerResult]) -> list[int]:
    return [r.run_id for r in results if r.run_id is not None]


def _report(storage: Any, store: Store, studies: list[tuple[str, Problem]],
            results: list[WorkerResult]) -> SearchReport:
    """Summaries of the studies (the baselines of these runs), and what the workers did."""
    run_ids = _run_ids(results)
    return SearchReport(
        summaries=[summarize(load_study(storage, name), problem, store, run_ids) for name, problem in studies],
        run_ids=run_ids,
        studies=[name for name, _ in studies],
        interrupted=any(r.interrupted for r in results),
        measured=sum(r.measured for r in results),
        reused=sum(r.reused for r in results),
        asked=sum(r.asked for r in results),
        infeasible=sum(r.infeasible for r in results),
        repeated=sum(r.repeated for r in results),
        exhausted=tuple(dict.fromkeys(name for r in results for name in r.exhausted)),
        stopped_early=tuple((name, max(r.stopped_early.get(name, 0) for r in results))
                            for name in dict.fromkeys(n for r in results for n in r.stopped_early)),
        seconds=tuple((phase, sum(r.seconds.get(phase, 0.0) for r in results))
                      for phase in dict.fromkeys(p for r in results for p in r.seconds)),
        workers=len(results),
        untuned=tuple(name for name, _ in studies if results and all(name in r.untuned for r in results)),
    )


def run_search(options: SearchOptions, console: Optional[Console] = None, hooks: Hooks = Hooks()) -> SearchReport:
    """Tune every problem of `options`; prints progress on `console`, returns the summary as data.

    `hooks` replace the backend, the builder or the clock; they serve one device, in this process.
    `--pass both` runs the forward studies, then (unless interrupted) the backward ones of the same problems.
    """
    console = console or Console(stderr=True)
    validate_options(options)
    if options.kernel_pass == BOTH:
        return _search_both(options, console, hooks)
    profile = _resolve(options)
    recorded = _recorded(options, profile, hooks)
    db_url = options.db_url or default_db_url()
    started = time.perf_counter()
    # One card: its GPU child's torch import overlaps the studies' preparation.
    # Several: the worker processes (each starting its GPU child) start while the studies are prepared.
    early = options.backend == "gpu" and not hooks.replaced
    with started_early(options.devices[0], early and len(options.devices) == 1), \
            started_workers(options.devices, options.backend == "gpu", not hooks.replaced) as processes, \
            opened_storage(db_url) as storage:
        report = _search(options, profile, db_url, storage, console, hooks, processes, recorded, started)
    return dataclasses.replace(report, wall_s=time.perf_counter() - started)


def _search(options: SearchOptions, profile: GpuProfile, db_url: str, storage: Any, console: Console,
            hooks: Hooks, processes: Optional[StartedWorkers], recorded: Optional[list[Problem]],
            started: float) -> SearchReport:
    options = dataclasses.replace(options, template=choose_template(options, profile, storage))
    manifest = load_manifest(options.template)
    say = _printer(console)
    problems = problems_of(options, profile, manifest, say)
    if recorded is not None:  # a replay of the profile's default problems: those the recording holds
        absent = [p for p in problems if p not in recorded]
        if absent:
            say(f"skipping {len(absent)} default problem(s) the recording has no trials of")
        problems = [p for p in problems if p in recorded]
        if not problems:
            check_recorded(options.replay_from, profile, default_problems(options, profile), recorded)
    with open_store(db_url) as store:
        studies, budgets = [], []
        for problem in problems:
            missing = missing_baselines_note(problem)  # said once here, not by each worker
            if missing:
                say(f"{problem.label}: {missing}")
            name = study_name_for(options, profile, problem, len(problems) > 1)
            study, budget = prepare_study(options, storage, store, profile, manifest, problem, name, say)
            studies.append(study)
            budgets.append(budget)
        done = [finished_trials(s) for s in studies]
        remaining = [None if b is None else max(b - d, 0) for b, d in zip(budgets, done)]
        if len(problems) > 1 or not options.shapes:
            say(plan_line(len(problems), remaining, None if options.shapes else profile.name))
        if options.time_budget_s and len(problems) > 1:
            say(split_line(options.time_budget_s, len(problems)))
        start = hooks.now()  # one clock reading: the time budget ends the same moment for every worker
        specs = [WorkerSpec(w, device, db_url, db_url, options.backend, worker_jobs(w, len(options.devices), studies,
                                                                                    remaining),
                            options.replay_from, options.force, options.seed, local_workers=len(options.devices),
                            confirm=options.confirm, confirm_rounds=options.confirm_rounds, objective=options.objective,
                            budget_end=start + options.time_budget_s if options.time_budget_s else None)
                 for w, device in enumerate(options.devices)]
        prepared = time.perf_counter()
        with SearchProgress(console) as progress:
            for i, problem in enumerate(problems):
                progress.add_problem(i, problem, budgets[i], done[i], options.objective)
            progress.track_problems(len(problems), options.time_budget_s)
            if len(specs) == 1:
                results = [run_here(specs[0], progress.handle, say, hooks)]
            else:
                if hooks.replaced:
                    raise TunerError("replaced hooks serve one device only (other devices run in child processes)")
                results = run_processes(specs, progress, say, processes)
        summing = time.perf_counter()
        report = _report(storage, store, [(s.study_name, p) for s, p in zip(studies, problems)], results)
        own = (("preparing the search", prepared - started), ("summing up", time.perf_counter() - summing))
        return dataclasses.replace(report, search_seconds=own)


def _search_both(options: SearchOptions, console: Console, hooks: Hooks) -> SearchReport:
    """--pass both: the forward studies, then (unless interrupted) the backward ones; a --time-budget gives the
    forward half of it and the backward what is left."""
    budget = options.time_budget_s
    first = dataclasses.replace(options, kernel_pass=FORWARD, time_budget_s=budget / 2 if budget else None)
    reports = [run_search(first, console, hooks)]
    if not reports[0].interrupted:
        left = max(1.0, budget - reports[0].wall_s) if budget else None
        reports.append(run_search(dataclasses.replace(options, kernel_pass=BACKWARD, time_budget_s=left), console,
                                  hooks))
    return merged_reports(reports)


def merged_reports(reports: list[SearchReport]) -> SearchReport:
    """One report of searches run one after another (--pass both): their lists joined, their counts summed."""
    def summed(field: str) -> tuple[tuple[str, float], ...]:
        pairs = [pair for r in reports for pair in getattr(r, field)]
        return tuple((k, sum(v for n, v in pairs if n == k)) for k in dict.fromkeys(n for n, _ in pairs))

    return SearchReport(
        summaries=[s for r in reports for s in r.summaries], run_ids=[i for r in reports for i in r.run_ids],
        studies=[s for r in reports for s in r.studies], interrupted=any(r.interrupted for r in reports),
        measured=sum(r.measured for r in reports), reused=sum(r.reused for r in reports),
        asked=sum(r.asked for r in reports), infeasible=sum(r.infeasible for r in reports),
        repeated=sum(r.repeated for r in reports), exhausted=tuple(e for r in reports for e in r.exhausted),
        stopped_early=tuple(e for r in reports for e in r.stopped_early), seconds=summed("seconds"),
        search_seconds=summed("search_seconds"), untuned=tuple(u for r in reports for u in r.untuned),
        wall_s=sum(r.wall_s for r in reports), workers=max(r.workers for r in reports))


def plan_line(problems: int, trials: list[Optional[int]], profile: Optional[str]) -> str:
    """What the search is about to do, said first: how many problems (`profile`: the profile's defaults) and
    how many trials each (None: as many as --time-budget allows)."""
    what = f"tuning {problems} problem{'s' if problems != 1 else ''}"
    if profile is not None:
        what += f" (the {profile} profile's defaults)"
    counts = sorted({t for t in trials if t is not None})
    if not counts:
        return f"{what}, as many trials as the time budget allows"
    each = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    return f"{what}, {each} trial{'s' if counts[-1] != 1 else ''} each"


def worker_jobs(worker: int, workers: int, studies: list[Any], remaining: list[Optional[int]]) -> tuple[WorkerJob, ...]:
    """The studies of one worker, in its order. Worker w starts on study w and goes round from there,
    so that with several problems each card begins on its own study and confirms it (a study's budget
    is shared: a worker leaves it once the trials taken reach it, and helps on the next). A time budget
    is shared as each study starts (WorkerSpec.budget_end, tuner.search.time_share)."""
    count = len(studies)
    order = [(worker + k) % count for k in range(count)]
    return tuple(WorkerJob(i, studies[i].study_name, remaining[i] if workers == 1 else None,
                           confirm=i % workers == worker) for i in order)


# --- `tuner worker`: join a study from another host ---------------------------------------------


def run_join(studies: list[str], storage_url: str, *, db_url: Optional[str] = None, backend: str = "gpu",
             replay_from: Optional[str] = None, trials: Optional[int] = None, device: int = 0,
             time_budget_s: Optional[float] = None, seed: Optional[int] = None, force: bool = False,
             console: Optional[Console] = None, hooks: Hooks = Hooks()) -> SearchReport:
    """Work on existing studies (created by `tuner search`) from this host, until their budgets are spent."""
    console = console or Console(stderr=True)
    check_backend(backend)
    if backend == "gpu":
        require_gpus((device,))
    if db_url is None:  # results go next to the study (never to the default store of this host)
        db_url = results_url_for(storage_url)
    with opened_storage(storage_url, create=False) as storage:  # joining: a missing store is an error, not made
        return _join(studies, storage, storage_url, db_url, backend, replay_from, trials, device, time_budget_s, seed,
                     force, console, hooks)


def _join(studies: list[str], storage: Any, storage_url: str, db_url: str, backend: str, replay_from: Optional[str],
          trials: Optional[int], device: int, time_budget_s: Optional[float], seed: Optional[int], force: bool,
          console: Console, hooks: Hooks) -> SearchReport:
    loaded = [load_study(storage, name) for name in studies]
    infos = [study_info(s) for s in loaded]
    if len({i.profile for i in infos}) > 1:
        raise TunerError("a worker serves one GPU profile; these studies name several")
    if len({i.objective for i in infos}) > 1:
        raise TunerError("a worker minimizes one objective; these studies name several (join them one by one)")
    jobs = []
    deadline = hooks.now() + time_budget_s if time_budget_s else None
    for i, (study, info) in enumerate(zip(loaded, infos)):
        left = trials if trials is not None else (None if info.budget is None else max(info.budget - finished_trials(study), 0))
        if left is None and deadline is None:
            raise TunerError(f"study {info.name!r} has no trial budget: give --trials or --time-budget")
        jobs.append(WorkerJob(i, info.name, left, deadline, beyond_budget=trials is not None))
    spec = WorkerSpec(0, device, db_url, storage_url, backend, tuple(jobs), replay_from, force, seed,
                      objective=infos[0].objective)
    # The GPU child starts while the progress display and the worker's store come up.
    with started_early(device, backend == "gpu" and not hooks.replaced), \
            SearchProgress(console) as progress:
        for job, info in zip(jobs, infos):
            progress.add_problem(job.index, info.problem, job.trials, objective=info.objective)
        result = run_here(spec, progress.handle, _printer(console), hooks=hooks)
    with open_store(db_url) as store:
        return _report(storage, store, [(i.name, i.problem) for i in infos], [result])
