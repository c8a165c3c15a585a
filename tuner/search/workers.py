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

import multiprocessing
import os
import queue as queue_module
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Optional, Self, Sequence

from optuna.trial import TrialState

from tuner.errors import TunerError
from tuner.kernels.manifest import load_manifest
from tuner.profiles import load_profile
from tuner.search.confirm import DEFAULT_CONFIRM, DEFAULT_ROUNDS, confirm_problem
from tuner.search.hooks import Hooks
from tuner.search.job import Context, Events, WorkerJob, WorkerResult
from tuner.search.liveness import await_running
from tuner.search.loop import ProblemSearch
from tuner.search.progress import SearchProgress
from tuner.search.samplers import make_sampler
from tuner.search.study import load_study, opened_storage, study_info
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


RESEED_STRIDE = 1000003  # a resumed study's seed moves by this much per trial it already holds


def compile_threads(local_workers: int) -> int:
    """nvcc threads of one worker: the host's CPUs shared by its workers (N pools of cpu_count oversubscribe)."""
    return max(1, (os.cpu_count() or 1) // max(1, local_workers))


def worker_seed(seed: Optional[int], worker: int, existing: int) -> Optional[int]:
    """The sampler seed of a worker: distinct per worker, and per resume (a resumed study with the
    seed it started with would re-ask the points it already has, all served from the store)."""
    return None if seed is None else seed + worker + RESEED_STRIDE * existing


# SIGTERM (a scheduler, `kill`, a closed session) is handled like Ctrl-C: the trial in hand
# finishes and is stored, the run is ended; a second one aborts.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _SigintHandler:
    """Installs `_handler` for SIGINT and SIGTERM while entered (main thread only), restores the previous ones."""

    previous: Any = None

    def _handler(self, signum: int, frame: Any) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            self.previous = {sig: signal.signal(sig, self._handler) for sig in STOP_SIGNALS}
        return self

    def __exit__(self, *_exc: Any) -> None:
        for sig, handler in (self.previous or {}).items():
            signal.signal(sig, handler)


class StopOnSigint(_SigintHandler):
    """First SIGINT sets `flag` (stop after the current trial); a second raises KeyboardInterrupt."""

    def __init__(self, flag: Any, say: Optional[Callable[[str], None]] = None) -> None:
        self.flag, self.say, self.previous = flag, say, None

    def _handler(self, signum: int, frame: Any) -> None:
        if self.flag.is_set():
            raise KeyboardInterrupt
        self.flag.set()
        if self.say:
            self.say("stopping after the current trial (Ctrl-C again to abort it)")


# --- a worker: one device, its studies in turn --------------------------------------------------


def run_worker(spec: WorkerSpec, events: Events, stop: Any, hooks: Hooks = Hooks()) -> WorkerResult:
    """Run a worker's jobs on its device; returns what it did (its run id included)."""
    with opened_storage(spec.storage_url) as storage:
        return _run_jobs(spec, events, stop, hooks, storage)


def _run_jobs(spec: WorkerSpec, events: Events, stop: Any, hooks: Hooks, storage: Any) -> WorkerResult:
    first = load_study(storage, spec.jobs[0].study)
    profile = load_profile(study_info(first).profile)
    started = time.perf_counter()
    backend = hooks.make_backend(spec.backend, spec.device, profile, replay_from=spec.replay_from, force=spec.force,
                                 seed=None if spec.seed is None else spec.seed + spec.worker)
    compile_pool = None
    try:
        if getattr(backend, "needs_compile", True):
            compile_pool = ThreadPoolExecutor(max_workers=compile_threads(spec.local_workers),
                                              thread_name_prefix="nvcc")
        with open_store(spec.db_url) as store:
            facts = backend.device_facts()
            run_id = store.start_run(RunInfo.for_this_process(
                gpu_name=facts.gpu_name, profile=profile.name, gpu_uuid=facts.gpu_uuid, driver=facts.driver,
                cuda_version=facts.cuda_version,
                replayed_from=redact_url(spec.replay_from) if spec.backend == "replay" and spec.replay_from else None,
            ))
            ctx = Context(store, backend, run_id, profile, facts.gpu_name, compile_pool, stop, events, hooks)
            ctx.result.run_id = run_id
            ctx.result.spent("start-up (worker, GPU context)", time.perf_counter() - started)
            try:
                for job in spec.jobs:
                    if stop.is_set():
                        break
                    _run_job(ctx, storage, job, spec)
            finally:
                store.finish_run(run_id)
            return ctx.result
    finally:
        if compile_pool is not None:
            compile_pool.shutdown(wait=False, cancel_futures=True)
        backend.close()


def _run_job(ctx: Context, storage: Any, job: WorkerJob, spec: WorkerSpec) -> None:
    info = study_info(load_study(storage, job.study))
    if info.profile != ctx.profile.name:
        raise TunerError(f"study {info.name!r} tunes for GPU profile {info.profile}, this worker for {ctx.profile.name}")
    manifest = load_manifest(info.template)
    seed = spec.seed if spec.seed is not None else info.seed
    trials = load_study(storage, job.study).get_trials(deepcopy=False)
    existing = sum(1 for t in trials if t.state != TrialState.WAITING)  # enqueued warm-start points don't count
    study = load_study(storage, job.study, make_sampler(info.sampler, worker_seed(seed, spec.worker, existing), manifest))
    started = time.perf_counter()
    try:
        for b in ctx.backend.baselines(info.problem):
            ctx.store.add_baseline(BaselineRecord(run_id=ctx.run_id, problem=info.problem, impl=b.impl,
                                                  median_us=b.median_us, p20_us=b.p20_us, p80_us=b.p80_us))
            ctx.events(("baseline", job.index, b.median_us, b.impl))
    except KeyboardInterrupt:
        ctx.interrupt()
        return
    ctx.result.spent("baselines", time.perf_counter() - started)
    ProblemSearch(ctx, study, info, job).run()
    if spec.confirm and job.confirm and not ctx.stop.is_set():  # one confirm stage per study
        note = lambda text: ctx.events(("note", job.index, text))  # noqa: E731
        started = time.perf_counter()
        try:
            await_running(study)
            confirm_problem(ctx, info.problem, info.template, spec.confirm, spec.confirm_rounds, note)
        except TunerError as exc:  # the search's results stand; only the confirmation is missing
            note(f"confirm stage skipped: {exc}")
        except KeyboardInterrupt:
            ctx.interrupt()
        ctx.result.spent("confirm stage", time.perf_counter() - started)


def run_here(spec: WorkerSpec, events: Events, say: Callable[[str], None], hooks: Hooks = Hooks()) -> WorkerResult:
    """Run one worker in this process; the first Ctrl-C stops it after the current trial."""
    stop = threading.Event()
    with StopOnSigint(stop, say):
        return run_worker(spec, events, stop, hooks)


# --- several devices: one worker process each ---------------------------------------------------


class EscalateOnSigint(_SigintHandler):
    """SIGINT in the parent of worker processes: the first sets `flag` (every worker stops after its
    current trial), a second terminates the children (each aborts its trial in flight), later ones kill them."""

    def __init__(self, flag: Any, procs: Sequence[Any], say: Optional[Callable[[str], None]] = None) -> None:
        self.flag, self.procs, self.say, self.previous = flag, procs, say, None
        self.presses = 0

    @property
    def aborted(self) -> bool:
        return self.presses > 1

    def _handler(self, signum: int, frame: Any) -> None:
        self.presses += 1
        if self.presses == 1:
            self.flag.set()
            if self.say:
                self.say("stopping after the current trial (Ctrl-C again to abort it)")
            return
        if self.say and self.presses == 2:
            self.say("aborting the trials in flight")
        for proc in self.procs:
            if not proc.is_alive():
                continue
            if self.presses == 2:
                proc.terminate()
            else:
                proc.kill()


def collect(events: Any, workers: Sequence[tuple[int, int, Any]], handle: Events, stop: Any,
            poll_s: float = 0.2) -> tuple[dict[int, WorkerResult], list[str]]:
    """Drain `events` until every worker process has exited; returns results and errors by worker.

    `workers`: (worker id, device, process). The first error sets `stop` so the others end after
    their current trial. Draining goes on until all processes are gone: a child whose queue buffer
    is not flushed into the pipe cannot exit, so nobody may stop reading while one still runs.
    """
    results: dict[int, WorkerResult] = {}
    errors: list[str] = []
    finished: set[int] = set()

    def take(event: tuple) -> None:
        if event[0] == "done":
            results[event[1]] = event[2]
            finished.add(event[1])
        elif event[0] == "error":
            errors.append(event[2])
            results.setdefault(event[1], WorkerResult(interrupted=True))
            finished.add(event[1])
            stop.set()
        else:
            handle(event)

    while True:
        try:
            take(events.get(timeout=poll_s))
            continue
        except queue_module.Empty:
            pass
        # Exited first, queue second: what an exited child put is in the pipe by now.
        gone = [(w, d, p) for w, d, p in workers if w not in finished and not p.is_alive()]
        while True:
            try:
                take(events.get_nowait())
            except queue_module.Empty:
                break
        for worker, device, proc in gone:
            if worker not in finished:  # died without a word (killed, segfault)
                errors.append(f"worker on device {device} died (exit code {proc.exitcode})")
                results[worker] = WorkerResult(interrupted=True)
                finished.add(worker)
                stop.set()
        if all(not p.is_alive() for _, _, p in workers) and len(finished) == len(workers):
            return results, errors


def run_processes(specs: list[WorkerSpec], progress: SearchProgress, say: Callable[[str], None]) -> list[WorkerResult]:
    """One worker process per device; their events drive the progress bars."""
    ctx = multiprocessing.get_context("spawn")
    events, stop = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_child_main, args=(spec, events, stop), name=f"tuner-worker-{spec.device}")
             for spec in specs]
    # Children start with SIGINT ignored (inherited through exec; Python keeps an ignored SIGINT),
    # so a Ctrl-C during their start-up cannot kill them: only the parent handles it.
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        for proc in procs:
            proc.start()
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    sigint = EscalateOnSigint(stop, procs, say)
    try:
        with sigint:
            results, errors = collect(events, [(s.worker, s.device, p) for s, p in zip(specs, procs)],
                                      progress.handle, stop)
    finally:
        for proc in procs:
            if proc.is_alive():  # only after an exception in the parent: don't leave children behind
                stop.set()
                proc.terminate()
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    if errors and not sigint.aborted:  # after an abort, terminated children are no error
        raise TunerError(errors[0])
    return [results.get(s.worker, WorkerResult(interrupted=True)) for s in specs]


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _child_main(spec: WorkerSpec, events: Any, stop: Any) -> None:
    """Entry of a worker process started by run_processes."""
    import traceback

    # The terminal's Ctrl-C reaches every process of the group: only the parent acts on it (it sets
    # `stop`); the parent's escalation (SIGTERM) aborts the trial in flight, as a second Ctrl-C does.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        result = run_worker(spec, events.put, stop)
        events.put(("done", spec.worker, result))
    except TunerError as exc:
        events.put(("error", spec.worker, str(exc)))
    except KeyboardInterrupt:
        events.put(("done", spec.worker, WorkerResult(interrupted=True)))
    except BaseException as exc:  # report, then die with the traceback on stderr
        events.put(("error", spec.worker, f"worker on device {spec.device} failed: {exc!r}"))
        traceback.print_exc()
        raise
