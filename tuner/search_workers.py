"""Workers: one per device, each working through its studies in turn, in this process or in child processes.

Runs: each worker records one `runs` row for its device (its card's facts and
its baselines: a ratio compares numbers of one card and process).

Ctrl-C: the first stops after the current trial (everything measured stays
stored), a second one aborts.
"""

from __future__ import annotations

import multiprocessing
import os
import queue as queue_module
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Optional

from tuner.errors import TunerError
from tuner.evaluation import Backend
from tuner.profiles import GpuProfile, load_profile
from tuner.search_backend import Hooks
from tuner.search_loop import Context, Events, ProblemSearch, WorkerJob, WorkerResult
from tuner.search_progress import SearchProgress
from tuner.search_space import make_sampler
from tuner.search_study import load_study, storage_for, study_info
from tuner.store import BaselineRecord, RunInfo, open_store
from tuner.templates import load_manifest


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


class StopOnSigint:
    """First SIGINT sets `flag` (stop after the current trial); a second raises KeyboardInterrupt."""

    def __init__(self, flag: Any, say: Optional[Callable[[str], None]] = None) -> None:
        self.flag, self.say, self.previous = flag, say, None

    def _handler(self, signum: int, frame: Any) -> None:
        if self.flag.is_set():
            raise KeyboardInterrupt
        self.flag.set()
        if self.say:
            self.say("stopping after the current trial (Ctrl-C again to abort it)")

    def __enter__(self) -> "StopOnSigint":
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *_exc: Any) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


# --- a worker: one device, its studies in turn --------------------------------------------------


def run_worker(spec: WorkerSpec, events: Events, stop: Any,
               backend_factory: Optional[Callable[[int, GpuProfile], Backend]] = None,
               hooks: Hooks = Hooks()) -> WorkerResult:
    """Run a worker's jobs on its device; returns what it did (its run id included)."""
    storage = storage_for(spec.storage_url)
    first = load_study(storage, spec.jobs[0].study)
    profile = load_profile(study_info(first).profile)
    if backend_factory is not None:
        backend = backend_factory(spec.device, profile)
    else:
        backend = hooks.make_backend(spec.backend, spec.device, profile, replay_from=spec.replay_from,
                                     force=spec.force)
    compile_pool = None
    try:
        if getattr(backend, "needs_compile", True):
            compile_pool = ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1), thread_name_prefix="nvcc")
        with open_store(spec.db_url) as store:
            facts = backend.device_facts()
            run_id = store.start_run(RunInfo.for_this_process(
                gpu_name=facts.gpu_name, profile=profile.name, gpu_uuid=facts.gpu_uuid, driver=facts.driver,
                cuda_version=facts.cuda_version,
            ))
            ctx = Context(store, backend, run_id, profile, facts.gpu_name, compile_pool, stop, events, hooks)
            ctx.result.run_id = run_id
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
    seed = None if seed is None else seed + spec.worker  # distinct streams per worker
    study = load_study(storage, job.study, make_sampler(info.sampler, seed, manifest))
    try:
        for b in ctx.backend.baselines(info.problem):
            ctx.store.add_baseline(BaselineRecord(run_id=ctx.run_id, problem=info.problem, impl=b.impl,
                                                  median_us=b.median_us, p20_us=b.p20_us, p80_us=b.p80_us))
            ctx.events(("baseline", job.index, b.median_us, b.impl))
    except KeyboardInterrupt:
        ctx.interrupt()
        return
    ProblemSearch(ctx, study, info, job).run()


def run_here(spec: WorkerSpec, events: Events, say: Callable[[str], None],
             backend_factory: Optional[Callable[[int, GpuProfile], Backend]] = None,
             hooks: Hooks = Hooks()) -> WorkerResult:
    """Run one worker in this process; the first Ctrl-C stops it after the current trial."""
    stop = threading.Event()
    with StopOnSigint(stop, say):
        return run_worker(spec, events, stop, backend_factory, hooks)


# --- several devices: one worker process each ---------------------------------------------------


def run_processes(specs: list[WorkerSpec], progress: SearchProgress, say: Callable[[str], None]) -> list[WorkerResult]:
    """One worker process per device; their events drive the progress bars."""
    ctx = multiprocessing.get_context("spawn")
    events, stop = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_child_main, args=(spec, events, stop), name=f"tuner-worker-{spec.device}")
             for spec in specs]
    results: dict[int, WorkerResult] = {}
    errors: list[str] = []
    with StopOnSigint(stop, say):
        for proc in procs:
            proc.start()
        try:
            while len(results) + len(errors) < len(procs):
                try:
                    event = events.get(timeout=0.2)
                except queue_module.Empty:
                    dead = [(s, p) for s, p in zip(specs, procs) if not p.is_alive() and p.exitcode != 0
                            and s.worker not in results]
                    if dead and events.empty():
                        spec, proc = dead[0]
                        errors.append(f"worker on device {spec.device} died (exit code {proc.exitcode})")
                        results[spec.worker] = WorkerResult(interrupted=True)
                    continue
                if event[0] == "done":
                    results[event[1]] = event[2]
                elif event[0] == "error":
                    errors.append(event[2])
                    results.setdefault(event[1], WorkerResult())
                else:
                    progress.handle(event)
        finally:
            for proc in procs:
                proc.join()
    if errors:
        raise TunerError(errors[0])
    return [results[s.worker] for s in specs]


def _child_main(spec: WorkerSpec, events: Any, stop: Any) -> None:
    """Entry of a worker process started by run_processes."""
    import traceback

    with StopOnSigint(stop):
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
