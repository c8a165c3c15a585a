"""Workers: one per device, each working through its studies in turn, in this process or in child processes.

Runs: each worker records one `runs` row for its device (its card's facts and
its baselines: a ratio compares numbers of one card and process).

Ctrl-C: the first stops after the current trial (everything measured stays
stored), a second one aborts. With worker processes only the parent listens
(the children ignore SIGINT): its first Ctrl-C sets `stop`, its second
terminates the children, which abort their trials in flight (SIGTERM raises
KeyboardInterrupt in a child).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Optional, Self

from optuna.trial import TrialState

from tuner import stop_signals
from tuner.backends.base import BaselineMeasurement
from tuner.errors import TunerError
from tuner.kernels.manifest import load_manifest
from tuner.profiles import load_profile
from tuner.runtime.baseline_log import log_path
from tuner.runtime.objective import figure
from tuner.search.confirm import DEFAULT_CONFIRM, DEFAULT_ROUNDS, confirm_problem, help_confirm
from tuner.search.confirm_ledger import StudyAttributes
from tuner.search.hooks import Hooks
from tuner.search.job import CONFIRM_STAGE, WAITING_FOR_WORKERS, Context, Events, WorkerJob, WorkerResult
from tuner.search.liveness import await_running
from tuner.search.loop import ProblemSearch
from tuner.search.samplers import make_sampler
from tuner.search.study import load_study, opened_storage, study_info
from tuner.search.time_share import trial_deadline
from tuner.store import BaselineRecord, RunInfo, open_store
from tuner.store.redact import redact_url


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker process needs (picklable)."""

    worker: int
    device: int
    db_url: str
    storage_url: str
    backend: str
    jobs: tuple[WorkerJob, ...]
    replay_from: Optional[str] = None
    force: bool = False
    seed: Optional[int] = None
    local_workers: int = 1  # workers on this host: they share its CPUs for nvcc
    confirm: int = DEFAULT_CONFIRM  # best variants re-timed after each study (0: no confirm stage)
    confirm_rounds: int = DEFAULT_ROUNDS
    objective: str = "time"  # what its studies minimize (each study says so too: checked)
    budget_end: Optional[float] = None  # when the search's --time-budget ends (Hooks.now), shared by the jobs


PLAN_WAIT_S = 10.0  # longest wait, once a study's trials are in, for its confirming worker's plan
RESEED_STRIDE = 1000003  # a resumed study's seed moves by this much per trial it already holds


def compile_threads(local_workers: int) -> int:
    """nvcc threads of one worker: the host's CPUs shared by its workers (N pools of cpu_count oversubscribe)."""
    return max(1, (os.cpu_count() or 1) // max(1, local_workers))


def worker_seed(seed: Optional[int], worker: int, existing: int) -> Optional[int]:
    """The sampler seed of a worker: distinct per worker, and per resume (a resumed study with the
    seed it started with would re-ask the points it already has, all served from the store). Within numpy's
    0 .. 2**32 - 1, which Optuna's samplers seed: a seed near the top, or a study of thousands of trials, wraps."""
    return None if seed is None else (seed + worker + RESEED_STRIDE * existing) % 2**32


# SIGTERM (a scheduler, `kill`, a closed session) is handled like Ctrl-C: the trial in hand
# finishes and is stored, the run is ended; a second one aborts.
STOP_SIGNALS = stop_signals.STOP_SIGNALS


class SigintHandler:
    """Installs `_handler` for SIGINT and SIGTERM while entered (main thread only), restores the previous ones."""

    previous: Any = None

    def _handler(self, signum: int, frame: Any) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            self.previous = {sig: signal.signal(sig, self._handler) for sig in STOP_SIGNALS}
        flag = getattr(self, "flag", None)
        if flag is not None and stop_signals.pending():  # signalled while the search was prepared
            flag.set()
        return self

    def __exit__(self, *_exc: Any) -> None:
        stop_signals.work_done()  # what is left (the report) is not aborted by a later signal
        for sig, handler in (self.previous or {}).items():
            signal.signal(sig, handler)


class StopOnSigint(SigintHandler):
    """First SIGINT (or SIGTERM) sets `flag` (stop after the current trial); a second raises KeyboardInterrupt
    (abort the trial in hand); later ones are ignored, so they cannot cut the abort's own storing short."""

    def __init__(self, flag: Any, say: Optional[Callable[[str], None]] = None) -> None:
        self.flag, self.say, self.previous = flag, say, None
        self.aborted = False

    def _handler(self, signum: int, frame: Any) -> None:
        stop_signals.note(signum)  # the exit code names the first signal
        if self.flag.is_set():
            if not self.aborted:
                self.aborted = True
                raise stop_signals.Stopped(signum)
            return
        self.flag.set()
        if self.say:
            self.say("stopping after the current trial (Ctrl-C again to abort it)")


# --- a worker: one device, its studies in turn --------------------------------------------------


def run_worker(spec: WorkerSpec, events: Events, stop: Any, hooks: Hooks = Hooks(),
               done: Optional[Callable[[WorkerResult], None]] = None) -> WorkerResult:
    """Run a worker's jobs on its device; returns what it did (its run id included). `done` is given the
    result as soon as the work is stored, before the GPU child shuts down (~1 s of torch's teardown)."""
    with opened_storage(spec.storage_url) as storage:
        return _run_jobs(spec, events, stop, hooks, storage, done)


def _run_jobs(spec: WorkerSpec, events: Events, stop: Any, hooks: Hooks, storage: Any,
              done: Optional[Callable[[WorkerResult], None]]) -> WorkerResult:
    first = load_study(storage, spec.jobs[0].study)
    profile = load_profile(study_info(first).profile)
    started, joined_at = time.perf_counter(), time.time()
    backend = hooks.make_backend(spec.backend, spec.device, profile, replay_from=spec.replay_from, force=spec.force,
                                 seed=None if spec.seed is None else spec.seed + spec.worker, objective=spec.objective)
    compile_pool, ctx = None, None
    try:
        if getattr(backend, "needs_compile", True):
            compile_pool = ThreadPoolExecutor(max_workers=compile_threads(spec.local_workers),
                                              thread_name_prefix="nvcc")
        with open_store(spec.db_url) as store:
            facts = backend.device_facts()
            replayed_from = redact_url(spec.replay_from) if spec.backend == "replay" and spec.replay_from else None
            run_id = store.start_run(RunInfo.for_this_process(
                gpu_name=facts.gpu_name, profile=profile.name, gpu_uuid=facts.gpu_uuid, driver=facts.driver,
                cuda_version=facts.cuda_version, replayed_from=replayed_from, objective=spec.objective,
            ))
            ctx = Context(store, backend, run_id, profile, facts.gpu_name, compile_pool, stop, events, hooks,
                          objective=spec.objective, replayed_from=replayed_from)
            ctx.result.run_id = run_id
            ctx.result.spent("start-up (worker, GPU context)", time.perf_counter() - started)
            try:
                _run_jobs_in_turn(ctx, storage, spec)
                if spec.confirm and spec.local_workers > 1:
                    _help_confirm(ctx, storage, spec, joined_at)
            finally:
                store.finish_run(run_id)
            ctx.result.spent_within(getattr(backend, "fixed_costs", dict)())  # inputs, references, ...
            if done is not None:
                done(ctx.result)
            return ctx.result
    finally:
        if compile_pool is not None:
            compile_pool.shutdown(wait=False, cancel_futures=True)
        closing = time.perf_counter()
        backend.close()
        if ctx is not None:  # after `done`: only a worker in this process reports it
            ctx.result.spent("stopping the GPU worker", time.perf_counter() - closing)


def _run_jobs_in_turn(ctx: Context, storage: Any, spec: WorkerSpec) -> None:
    """The worker's studies in its order. With a time budget (spec.budget_end), each one's trials stop at its
    share of what is left (time_share.trial_deadline); once it is spent, the studies left are not started.
    The next study's first points are asked (their compiles started) before a study's confirm stage, whose
    seconds of GPU rounds then hide the next study's first nvcc runs."""
    confirms: list[float] = []  # this worker's confirm stages so far (s): what the next one is expected to take
    ahead: list[ProblemSearch] = []  # the next study, started during the confirm stage of the one before
    try:
        for k, job in enumerate(spec.jobs):
            if ctx.stop.is_set():
                break
            if spec.budget_end is not None:
                now = ctx.hooks.now()
                if now >= spec.budget_end:
                    ctx.result.untuned.extend(j.study for j in spec.jobs[k:])
                    break
                expected = sum(confirms) / len(confirms) if confirms else 0.0
                job = dataclasses.replace(job, deadline=trial_deadline(now, spec.budget_end, len(spec.jobs) - k,
                                                                       expected))
            search = ahead.pop() if ahead else _start_job(ctx, storage, job, spec)
            search.job = job  # its deadline, now that it runs

            def start_next(after: int = k) -> None:
                if after + 1 < len(spec.jobs) and not ctx.stop.is_set():
                    ahead.append(_start_job(ctx, storage, spec.jobs[after + 1], spec))

            before = ctx.result.seconds.get(CONFIRM_STAGE, 0.0)
            _run_job(ctx, search, spec, start_next)
            if ctx.result.seconds.get(CONFIRM_STAGE, 0.0) > before:
                confirms.append(ctx.result.seconds[CONFIRM_STAGE] - before)
            if job.confirm and not ctx.stop.is_set():  # its one confirming worker says when the problem is done
                ctx.events(("finished", job.index))
    finally:
        for search in ahead:  # started, but the search stopped (or its budget ran out) before it
            search.abandon()


def _start_job(ctx: Context, storage: Any, job: WorkerJob, spec: WorkerSpec) -> ProblemSearch:
    """The study's search, its first points asked (their compiles running)."""
    info = study_info(load_study(storage, job.study))
    if info.profile != ctx.profile.name:
        raise TunerError(f"study {info.name!r} tunes for GPU profile {info.profile}, this worker for {ctx.profile.name}")
    if info.objective != ctx.objective:
        raise TunerError(f"study {info.name!r} minimizes {info.objective}, this worker {ctx.objective}")
    manifest = load_manifest(info.template)
    seed = spec.seed if spec.seed is not None else info.seed
    trials = load_study(storage, job.study).get_trials(deepcopy=False)
    existing = sum(1 for t in trials if t.state != TrialState.WAITING)  # enqueued warm-start points don't count
    study = load_study(storage, job.study, make_sampler(info.sampler, worker_seed(seed, spec.worker, existing), manifest))
    search = ProblemSearch(ctx, study, info, job)
    search.start()  # the first trials compile while the baselines (FlashAttention-4's compile: seconds) are timed
    return search


def _run_job(ctx: Context, search: ProblemSearch, spec: WorkerSpec, start_next: Callable[[], None]) -> None:
    """A started study's baselines, trials and confirm stage; `start_next` starts the next study before it."""
    job, info, study = search.job, search.info, search.study
    started = time.perf_counter()
    try:
        measured = ctx.backend.baselines(info.problem)
        for b in measured:
            ctx.store.add_baseline(BaselineRecord(run_id=ctx.run_id, problem=info.problem, impl=b.impl, timing=b.timing))
            if figure(ctx.objective, b) is not None:  # the progress shows the objective's figures
                ctx.events(("baseline", job.index, figure(ctx.objective, b), b.impl))
        if any(b.warnings for b in measured):
            ctx.events(("note", job.index, baseline_warnings_note(measured)))
    except KeyboardInterrupt:
        ctx.interrupt()
    ctx.result.spent("baselines", time.perf_counter() - started)
    search.run()  # stopped: tells the trials asked ahead interrupted
    if spec.confirm and job.confirm and not ctx.stop.is_set():  # one confirm stage per study
        start_next()  # its asking is timed as such (ProblemSearch.start)
        note = lambda text: ctx.events(("note", job.index, text))  # noqa: E731
        started = time.perf_counter()
        try:
            started = _await_last_trials(ctx, study)
            confirm_problem(ctx, info.problem, info.template, spec.confirm, spec.confirm_rounds, note,
                            StudyAttributes(study))
        except TunerError as exc:  # the search's results stand; only the confirmation is missing
            note(f"confirm stage skipped: {exc}")
        except KeyboardInterrupt:
            ctx.interrupt()
        ctx.result.spent(CONFIRM_STAGE, time.perf_counter() - started)


def baseline_warnings_note(measured: list[BaselineMeasurement]) -> str:
    """One line for the warnings the baselines raised (kept out of the output, in their log)."""
    counts = ", ".join(f"{b.impl} {b.warnings}" for b in measured if b.warnings)
    return f"baseline warnings ({counts}) written to {log_path()}"


def _await_last_trials(ctx: Context, study: Any) -> float:
    """Wait for the other workers' last trials of `study` (stored before a confirm stage picks the best);
    returns the time it ended."""
    waited = time.perf_counter()
    await_running(study)
    ended = time.perf_counter()
    ctx.result.spent(WAITING_FOR_WORKERS, ended - waited)
    return ended


def _help_confirm(ctx: Context, storage: Any, spec: WorkerSpec, since: float) -> None:
    """With nothing left to measure, time rounds of the confirm stages other workers of this search run
    on the studies this one shared (each plan published since this worker started)."""
    for job in spec.jobs:
        if job.confirm or ctx.stop.is_set():
            continue
        study = load_study(storage, job.study)
        started = time.perf_counter()
        try:
            started = _await_last_trials(ctx, study)  # the confirming worker publishes its plan after them
            help_confirm(ctx, StudyAttributes(study), study_info(study).problem, since, PLAN_WAIT_S)
        except TunerError as exc:  # the confirming worker's own rounds stand
            ctx.events(("note", job.index, f"could not help the confirm stage: {exc}"))
        except KeyboardInterrupt:
            ctx.interrupt()
        ctx.result.spent(CONFIRM_STAGE, time.perf_counter() - started)


def run_here(spec: WorkerSpec, events: Events, say: Callable[[str], None], hooks: Hooks = Hooks()) -> WorkerResult:
    """Run one worker in this process; the first Ctrl-C stops it after the current trial."""
    stop = threading.Event()
    with StopOnSigint(stop, say):
        result = run_worker(spec, events, stop, hooks)
    if stop.is_set():  # stopped before its first trial too (a signal while the search was prepared)
        result.interrupted = True
    return result


# --- the body of a worker process (several devices; started by tuner.search.worker_processes) -----


def child_main(spec: WorkerSpec, events: Any, stop: Any) -> None:
    """A worker process started by run_processes, entered through tuner.search.worker_entry (which has
    set the signals: SIGINT ignored, since the terminal's Ctrl-C reaches every process of the group and
    only the parent acts on it; the parent's escalation, SIGTERM, aborts the trial in flight)."""
    import traceback

    told = []

    def tell(result: WorkerResult) -> None:  # before the GPU child's teardown: the parent goes on meanwhile
        events.put(("done", spec.worker, result))
        told.append(True)

    try:
        result = run_worker(spec, events.put, stop, done=tell)
        if not told:
            tell(result)
    except TunerError as exc:
        events.put(("error", spec.worker, str(exc)))
    except KeyboardInterrupt:
        events.put(("done", spec.worker, WorkerResult(interrupted=True)))
    except BaseException as exc:  # report, then die with the traceback on stderr
        events.put(("error", spec.worker, f"worker on device {spec.device} failed: {exc!r}"))
        traceback.print_exc()
        raise
