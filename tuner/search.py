"""The search: Optuna ask/tell over a template's space, one trial at a time into the store.

    report = run_search(SearchOptions(gpu="h100", shapes=("16,16,2048,64",), trials=200))

Per problem, a worker (one per device) asks Optuna for a point, and:
- infeasible      -> stored as `pruned` with the reason, told PRUNED, never compiled;
- already measured (same problem, template hash, parameters, GPU) in the store
                  -> told the stored result, not measured again, no new row;
- measured by another worker right now -> waits for it, then the same;
- otherwise       -> compiled (a thread pool running ahead of the GPU; nvcc
                     runs in subprocesses), measured by the Backend, stored
                     (one transaction), told (median µs, or FAIL/PRUNED).

Backends: `gpu` is tuner.gpu_worker.GpuBackend(device=..., profile=...);
`replay` is tuner.replay.ReplayBackend. A backend whose `needs_compile` is
False is given compiled=None and no compiler is ever called.

Runs: each worker process records one `runs` row for its device (its card's
facts and its baselines: a ratio compares numbers of one card and process).

Ctrl-C: the first stops after the current trial (everything measured stays
stored; the summary prints; the CLI exits 130), a second one aborts.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import queue as queue_module
import signal
import socket
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState
from rich.console import Console

from tuner.compiler import CompileResult, compile_source
from tuner.errors import NoGpuError, TunerError
from tuner.evaluation import Backend, Measurement
from tuner.feasibility import Feasibility, check, supports_problem
from tuner.problem import Problem, problem_from_shape
from tuner.profiles import GpuProfile, load_profile, resolve_profile
from tuner.search_progress import SearchProgress
from tuner.search_space import DEFAULT_SAMPLER, SAMPLERS, distributions, grid_size, make_sampler, study_name
from tuner.search_study import (
    ATTR_BUDGET, ATTR_INTERRUPTED, ATTR_PROBLEM, ATTR_PROFILE, ATTR_REASON, ATTR_SAMPLER, ATTR_SEED,
    ATTR_SOURCE, ATTR_STATUS, ATTR_STORE_ID, ATTR_TEMPLATE, ATTR_VARIANT, StudyInfo, finished_trials,
    load_study, problem_attr, split_budget, storage_for, study_exists, study_info,
)  # fmt: skip
from tuner.space import Variant, variant_from_params
from tuner.store import RunInfo, Store, TrialFilter, TrialRecord, TrialRow, TrialStatus, default_db_url, open_store
from tuner.summary import ProblemSummary, summarize
from tuner.templates import Manifest, load_manifest, render

DEFAULT_TEMPLATE = "attn_fwd_mma"
DEFAULT_TRIALS = 100
WARM_START = 3  # best variants of the nearest recorded problem, enqueued first
DUPLICATE_WAIT_S = 600.0  # longest wait for another worker measuring the same variant
ATTR_WORKER = "worker"  # host:pid of the process that asked a trial
BACKENDS = ("gpu", "replay")
_now = time.time  # wall clock of deadlines (tests replace it)

Events = Callable[[tuple], None]


# --- options and results ------------------------------------------------------------------------


@dataclass(frozen=True)
class SearchOptions:
    gpu: str = "auto"
    shapes: tuple[str, ...] = ()
    heads_kv: Optional[int] = None
    dtype: str = "fp16"
    causal: bool = False
    layout: str = "bhsd"
    template: str = DEFAULT_TEMPLATE
    trials: Optional[int] = None
    time_budget_s: Optional[float] = None
    sampler: str = DEFAULT_SAMPLER
    seed: Optional[int] = None
    study: Optional[str] = None
    resume: bool = False
    devices: tuple[int, ...] = (0,)
    db_url: Optional[str] = None
    backend: str = "gpu"
    replay_from: Optional[str] = None
    force: bool = False
    profile_top: int = 0
    warm_start: int = WARM_START


@dataclass(frozen=True)
class WorkerJob:
    """One study for a worker: how many new trials it asks, and until when."""

    index: int  # position of the problem in the search (progress events)
    study: str
    trials: Optional[int]
    deadline: Optional[float] = None  # wall-clock time after which no trial is started


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


@dataclass
class WorkerResult:
    run_id: Optional[int] = None
    measured: int = 0  # trials the backend measured
    reused: int = 0  # trials served from the store
    pruned: int = 0
    asked: int = 0
    interrupted: bool = False


@dataclass(frozen=True)
class SearchReport:
    summaries: list[ProblemSummary]
    run_ids: list[int]
    studies: list[str]
    interrupted: bool
    measured: int
    reused: int
    asked: int


# --- backends -----------------------------------------------------------------------------------


def make_backend(kind: str, device: int, profile: GpuProfile, *, replay_from: Optional[str] = None,
                 force: bool = False) -> Backend:
    """The backend `kind` ("gpu" or "replay") measuring on `device`."""
    if kind == "replay":
        if not replay_from:
            raise TunerError("--backend replay needs --from DB_URL (a results store recorded on a GPU)")
        from tuner.replay import ReplayBackend

        return ReplayBackend(replay_from, profile, force=force)
    if kind == "gpu":
        from tuner.gpu_worker import GpuBackend

        return GpuBackend(device=device, profile=profile)
    raise TunerError(f"unknown backend {kind!r}; expected one of {', '.join(BACKENDS)}")


def _require_gpus(devices: tuple[int, ...]) -> None:
    """NoGpuError unless torch sees a CUDA GPU for every requested device."""
    import torch

    if not torch.cuda.is_available():
        raise NoGpuError(
            "no usable CUDA GPU on this machine (torch.cuda.is_available() is False); "
            "use --backend replay --from DB_URL to replay a recorded search"
        )
    count = torch.cuda.device_count()
    missing = [d for d in devices if d < 0 or d >= count]
    if missing:
        raise TunerError(f"CUDA device {missing[0]} does not exist; this machine has {count}")


def compile_variant(variant: Variant, arch: str) -> CompileResult:
    """Render and compile one variant (runs in the compile thread pool)."""
    return compile_source(render(variant), variant.name, arch)


# --- stopping -----------------------------------------------------------------------------------


class _StopOnSigint:
    """First SIGINT sets `flag` (stop after the current trial); a second raises KeyboardInterrupt."""

    def __init__(self, flag: Any, say: Optional[Callable[[str], None]] = None) -> None:
        self.flag, self.say, self.previous = flag, say, None

    def _handler(self, signum: int, frame: Any) -> None:
        if self.flag.is_set():
            raise KeyboardInterrupt
        self.flag.set()
        if self.say:
            self.say("stopping after the current trial (Ctrl-C again to abort it)")

    def __enter__(self) -> "_StopOnSigint":
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *_exc: Any) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


_WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"


def _abandoned(trial: FrozenTrial) -> bool:
    """A running trial nobody will finish: told interrupted, or asked by a dead process of this host."""
    if trial.user_attrs.get(ATTR_INTERRUPTED):
        return True
    host, _, pid = str(trial.user_attrs.get(ATTR_WORKER, "")).rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


# --- one problem --------------------------------------------------------------------------------


@dataclass
class _Pending:
    trial: Trial
    variant: Variant
    feasibility: Feasibility
    compile: Optional[Future] = None
    wait_for: Optional[int] = None  # number of another worker's running trial of the same variant


@dataclass
class _Context:
    """What every trial of a worker shares."""

    store: Store
    backend: Backend
    run_id: int
    profile: GpuProfile
    gpu_name: str
    compile_pool: Optional[ThreadPoolExecutor]
    stop: Any  # threading.Event or multiprocessing.Event
    events: Events
    result: WorkerResult = field(default_factory=WorkerResult)


class ProblemSearch:
    """The ask/tell loop of one study on one worker."""

    def __init__(self, ctx: _Context, study: optuna.Study, info: StudyInfo, job: WorkerJob) -> None:
        self.ctx, self.study, self.info, self.job = ctx, study, info, job
        self.problem = info.problem
        self.manifest: Manifest = load_manifest(info.template)
        self.distributions = distributions(self.manifest)
        self.asked = 0
        self._ignored: set[int] = set()  # running trials abandoned mid-ask (a killed process)

    # The loop ----------------------------------------------------------------------------------

    def run(self) -> None:
        pending: deque[_Pending] = deque()
        lookahead = (self.ctx.compile_pool._max_workers + 1) if self.ctx.compile_pool else 1
        current: Optional[_Pending] = None
        try:
            while not self.ctx.stop.is_set():
                while len(pending) < lookahead and self._may_ask():
                    item = self._ask()
                    if item is not None:
                        pending.append(item)
                if not pending or self.ctx.stop.is_set():
                    break
                current = pending.popleft()
                self._finish(current)
                current = None
        except KeyboardInterrupt:
            self.ctx.stop.set()
            self.ctx.result.interrupted = True
        finally:
            for item in ([current] if current else []) + list(pending):
                if item.compile is not None:
                    item.compile.cancel()
                item.trial.set_user_attr(ATTR_INTERRUPTED, True)
                self.study.tell(item.trial, state=TrialState.FAIL)
        if self.ctx.stop.is_set():
            self.ctx.result.interrupted = True

    def _may_ask(self) -> bool:
        if self.ctx.stop.is_set():
            return False
        if self.job.trials is not None and self.asked >= self.job.trials:
            return False
        if self.job.deadline is not None and _now() >= self.job.deadline:
            return False
        sampler = self.study.sampler
        if isinstance(sampler, optuna.samplers.GridSampler) and sampler.is_exhausted(self.study):
            return False
        return True

    def _ask(self) -> Optional[_Pending]:
        """Ask one point; settle it at once when it needs no GPU, else start its compile."""
        trial = self.study.ask(self.distributions)
        trial.set_user_attr(ATTR_WORKER, _WORKER_ID)
        self.asked += 1
        self.ctx.result.asked += 1
        variant = variant_from_params(self.info.template, self.problem, trial.params)
        trial.set_user_attr(ATTR_VARIANT, variant.name)
        feasibility = check(variant, self.problem, self.ctx.profile)
        if not feasibility.ok:
            self._store(trial, variant, TrialStatus.PRUNED, error=feasibility.reason,
                        smem_bytes=feasibility.smem_bytes or None)
            self._tell_pruned(trial, feasibility.reason)
            return None
        # Running trials first, the store second: a trial is stored before it is told,
        # so a duplicate that finished in between is found in the store.
        item = _Pending(trial, variant, feasibility, wait_for=self._running_duplicate(trial))
        if item.wait_for is None:
            known = self._known(variant)
            if known is not None:
                self._tell_known(trial, known)
                return None
        if item.wait_for is None and self._needs_compile:
            assert self.ctx.compile_pool is not None
            item.compile = self.ctx.compile_pool.submit(compile_variant, variant, self.ctx.profile.nvcc_arch)
        return item

    def _finish(self, item: _Pending) -> None:
        if item.wait_for is not None:
            if self._await_duplicate(item):
                return
            if self._needs_compile:
                assert self.ctx.compile_pool is not None
                item.compile = self.ctx.compile_pool.submit(compile_variant, item.variant, self.ctx.profile.nvcc_arch)
        compiled: Optional[CompileResult] = None
        if item.compile is not None:
            compiled = item.compile.result()
            if not compiled.ok:
                self._store(item.trial, item.variant, TrialStatus.COMPILE_ERROR, compiled=compiled,
                            feasibility=item.feasibility, error="compile error (see the compile log)")
                self._tell(item.trial, TrialState.FAIL, TrialStatus.COMPILE_ERROR, "measured")
                return
        # NVTX ranges of this trial are named run<id>/trial<n>/<variant>/<phase>.
        prefix = f"run{self.ctx.run_id}/trial{item.trial.number}"
        measurement = self.ctx.backend.measure(self.problem, item.variant, compiled, range_prefix=prefix)
        self.ctx.result.measured += 1
        self._store_measurement(item, compiled, measurement)

    # Outcomes ----------------------------------------------------------------------------------

    @property
    def _needs_compile(self) -> bool:
        return bool(getattr(self.ctx.backend, "needs_compile", True))

    def _known(self, variant: Variant) -> Optional[TrialRow]:
        return self.ctx.store.find_trial(self.problem, variant.template, self.manifest.source_hash,
                                         variant.stored_params(), self.ctx.gpu_name)

    def _running_duplicate(self, trial: Trial) -> Optional[int]:
        """Number of an earlier-asked running trial of the same point (another worker, or compiling ahead).

        A running trial whose parameters are not all written yet (its ask is in
        progress elsewhere) is waited for briefly, then ignored for good.
        """
        params, wanted = trial.params, len(self.distributions)
        deadline = time.monotonic() + 2.0
        while True:
            incomplete = []
            for other in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                if other.number >= trial.number or other.number in self._ignored or _abandoned(other):
                    continue
                if len(other.params) < wanted:
                    incomplete.append(other.number)
                elif other.params == params:
                    return other.number
            if not incomplete:
                return None
            if time.monotonic() > deadline:
                self._ignored.update(incomplete)
                return None
            time.sleep(0.01)

    def _await_duplicate(self, item: _Pending) -> bool:
        """Wait for the other worker's trial of this variant; True when its result was reused."""
        deadline = time.monotonic() + DUPLICATE_WAIT_S
        while time.monotonic() < deadline and not self.ctx.stop.is_set():
            known = self._known(item.variant)
            if known is not None:
                self._tell_known(item.trial, known)
                return True
            other = self._trial_by_number(item.wait_for)
            if other is None or other.state != TrialState.RUNNING or _abandoned(other):
                known = self._known(item.variant)
                if known is not None:
                    self._tell_known(item.trial, known)
                    return True
                if other is not None and other.state == TrialState.PRUNED:
                    self._tell_pruned(item.trial, str(other.user_attrs.get(ATTR_REASON, "pruned")))
                    return True
                return False  # the other trial was abandoned: measure it here
            time.sleep(0.05)
        return False

    def _trial_by_number(self, number: Optional[int]) -> Optional[FrozenTrial]:
        for other in self.study.get_trials(deepcopy=False):
            if other.number == number:
                return other
        return None

    def _store_measurement(self, item: _Pending, compiled: Optional[CompileResult], m: Measurement) -> None:
        status = TrialStatus.parse(m.status)
        store_id = self._store(item.trial, item.variant, status, measurement=m, compiled=compiled,
                               feasibility=item.feasibility, error=m.error)
        item.trial.set_user_attr(ATTR_STORE_ID, store_id)
        if status is TrialStatus.OK and m.median_us is not None and math.isfinite(m.median_us):
            self._tell(item.trial, TrialState.COMPLETE, status, "measured", m.median_us)
        elif status is TrialStatus.PRUNED:
            self._tell_pruned(item.trial, m.error or "pruned by the backend")
        else:
            self._tell(item.trial, TrialState.FAIL, status, "measured")

    def _tell_known(self, trial: Trial, row: TrialRow) -> None:
        trial.set_user_attr(ATTR_STORE_ID, row.id)
        self.ctx.result.reused += 1
        if row.status is TrialStatus.OK and row.median_us is not None:
            self._tell(trial, TrialState.COMPLETE, row.status, "store", row.median_us)
        else:
            self._tell(trial, TrialState.FAIL, row.status, "store")

    def _tell_pruned(self, trial: Trial, reason: str) -> None:
        trial.set_user_attr(ATTR_REASON, reason)
        self.ctx.result.pruned += 1
        self._tell(trial, TrialState.PRUNED, TrialStatus.PRUNED, "pruned")

    def _tell(self, trial: Trial, state: TrialState, status: TrialStatus, source: str,
              value: Optional[float] = None) -> None:
        trial.set_user_attr(ATTR_STATUS, status.value)
        trial.set_user_attr(ATTR_SOURCE, source)
        if state == TrialState.COMPLETE:
            self.study.tell(trial, value)
        else:
            self.study.tell(trial, state=state)
        self.ctx.events(("trial", self.job.index, value))

    def _store(self, trial: Trial, variant: Variant, status: TrialStatus, *, error: Optional[str] = None,
               measurement: Optional[Measurement] = None, compiled: Optional[CompileResult] = None,
               feasibility: Optional[Feasibility] = None, smem_bytes: Optional[int] = None) -> int:
        m = measurement
        return self.ctx.store.add_trial(TrialRecord(
            run_id=self.ctx.run_id,
            problem=self.problem,
            template=variant.template,
            template_hash=self.manifest.source_hash,
            params=variant.stored_params(),
            variant_name=variant.name,
            status=status,
            study=self.study.study_name,
            trial_number=trial.number,
            median_us=m.median_us if m else None,
            p20_us=m.p20_us if m else None,
            p80_us=m.p80_us if m else None,
            rel_error=m.rel_error if m else None,
            compile_s=compiled.seconds if compiled else None,
            registers=compiled.registers if compiled and compiled.ok else None,
            spill_bytes=compiled.spill_bytes if compiled and compiled.ok else None,
            cubin_sha256=(compiled.cubin_sha256 or None) if compiled else None,
            compile_log=compiled.log if compiled and not compiled.ok else None,
            smem_bytes=feasibility.smem_bytes if feasibility else smem_bytes,
            error=error,
        ))


# --- a worker: one device, its studies in turn --------------------------------------------------


def run_worker(spec: WorkerSpec, events: Events, stop: Any,
               backend_factory: Optional[Callable[[int, GpuProfile], Backend]] = None) -> WorkerResult:
    """Run a worker's jobs on its device; returns what it did (its run id included)."""
    storage = storage_for(spec.storage_url)
    first = load_study(storage, spec.jobs[0].study)
    profile = load_profile(study_info(first).profile)
    if backend_factory is not None:
        backend = backend_factory(spec.device, profile)
    else:
        backend = make_backend(spec.backend, spec.device, profile, replay_from=spec.replay_from, force=spec.force)
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
            ctx = _Context(store, backend, run_id, profile, facts.gpu_name, compile_pool, stop, events)
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


def _run_job(ctx: _Context, storage: Any, job: WorkerJob, spec: WorkerSpec) -> None:
    info = study_info(load_study(storage, job.study))
    if info.profile != ctx.profile.name:
        raise TunerError(f"study {info.name!r} tunes for GPU profile {info.profile}, this worker for {ctx.profile.name}")
    manifest = load_manifest(info.template)
    seed = spec.seed if spec.seed is not None else info.seed
    seed = None if seed is None else seed + spec.worker  # distinct streams per worker
    study = load_study(storage, job.study, make_sampler(info.sampler, seed, manifest))
    try:
        for b in ctx.backend.baselines(info.problem):
            from tuner.store import BaselineRecord

            ctx.store.add_baseline(BaselineRecord(run_id=ctx.run_id, problem=info.problem, impl=b.impl,
                                                  median_us=b.median_us, p20_us=b.p20_us, p80_us=b.p80_us))
            ctx.events(("baseline", job.index, b.median_us, b.impl))
    except KeyboardInterrupt:
        ctx.stop.set()
        ctx.result.interrupted = True
        return
    ProblemSearch(ctx, study, info, job).run()


def _child_main(spec: WorkerSpec, events: Any, stop: Any) -> None:
    """Entry of a worker process started by run_search (--devices)."""
    import traceback

    with _StopOnSigint(stop):
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


# --- the search: problems, studies, workers, summary --------------------------------------------


def problems_of(options: SearchOptions, profile: GpuProfile, manifest: Manifest,
                say: Callable[[str], None]) -> list[Problem]:
    """--shape problems (each must suit the template), or the profile's defaults that do."""
    if options.shapes:
        problems = [problem_from_shape(s, dtype=options.dtype, causal=options.causal, heads_kv=options.heads_kv,
                                       layout=options.layout) for s in options.shapes]
        for p in problems:
            why = supports_problem(manifest, p)
            if why:
                raise TunerError(f"cannot tune {p.label}: {why}")
        return list(dict.fromkeys(problems))
    problems = []
    for p in profile.default_problems:
        why = supports_problem(manifest, p)
        if why:
            say(f"skipping default problem {p.label}: {why}")
        else:
            problems.append(p)
    if not problems:
        raise TunerError(f"none of {profile.name}'s default problems suits template {manifest.name}; give --shape")
    return problems


def warm_start_points(store: Store, profile: str, template: str, problem: Problem, k: int,
                      manifest: Manifest) -> list[dict[str, Any]]:
    """Parameters of the `k` best ok variants of the nearest recorded problem (same GPU profile, template,
    head dim, dtype and causality; nearest in log(B*H*Sq*Sk))."""
    if k <= 0:
        return []
    best = store.best_trials(TrialFilter(gpu=profile, template=template, dtype=problem.dtype, causal=problem.causal))
    candidates = {row.problem for row in best if row.profile == profile and row.problem.head_dim == problem.head_dim}
    if not candidates:
        return []
    size = math.log(problem.batch * problem.heads * problem.seq_q * problem.seq_k)
    nearest = min(candidates, key=lambda p: (abs(math.log(p.batch * p.heads * p.seq_q * p.seq_k) - size),
                                             p != problem, p))
    rows = store.query_trials(TrialFilter(
        gpu=profile, shape=(nearest.batch, nearest.heads, nearest.seq_q, nearest.seq_k, nearest.head_dim),
        dtype=nearest.dtype, causal=nearest.causal, template=template, status=TrialStatus.OK,
    ))
    rows = sorted((r for r in rows if r.problem == nearest and r.profile == profile and r.median_us is not None),
                  key=lambda r: r.median_us)
    points: list[dict[str, Any]] = []
    for row in rows:
        params = {k2: v for k2, v in row.params.items() if k2 in manifest.params}
        if set(params) != set(manifest.params) or params in points:
            continue
        if any(v not in manifest.params[name].values for name, v in params.items()):
            continue  # recorded with an older manifest
        points.append(params)
        if len(points) == k:
            break
    return points


def _study_name_for(options: SearchOptions, profile: GpuProfile, problem: Problem, several: bool) -> str:
    if options.study:
        from tuner.search_space import problem_key

        return f"{options.study}-{problem_key(problem)}" if several else options.study
    return study_name(profile.name, options.template, problem)


def _prepare_study(options: SearchOptions, storage: Any, store: Store, profile: GpuProfile, manifest: Manifest,
                   problem: Problem, name: str) -> tuple[optuna.Study, Optional[int]]:
    """Create (or with --resume, load) the study; returns it and its total trial budget."""
    sampler = make_sampler(options.sampler, options.seed, manifest)  # validates the name early
    if study_exists(storage, name):
        if not options.resume:
            raise TunerError(f"study {name!r} already exists; pass --resume to continue it, or --study NAME for a new one")
        study = load_study(storage, name, sampler)
        info = study_info(study)
        if (info.problem, info.template, info.profile) != (problem, options.template, profile.name):
            raise TunerError(f"study {name!r} tunes {info.template} for {info.problem.label} on {info.profile}, "
                             f"not {options.template} for {problem.label} on {profile.name}")
        budget = options.trials if options.trials is not None else info.budget
    else:
        study = optuna.create_study(study_name=name, storage=storage, direction="minimize", sampler=sampler)
        budget = options.trials
        if budget is None and options.sampler == "grid":
            budget = grid_size(manifest)
        if budget is None and options.time_budget_s is None:
            budget = DEFAULT_TRIALS
        for key, value in ((ATTR_PROBLEM, problem_attr(problem)), (ATTR_TEMPLATE, options.template),
                           (ATTR_PROFILE, profile.name), (ATTR_SAMPLER, options.sampler), (ATTR_SEED, options.seed)):
            study.set_user_attr(key, value)
        if options.sampler != "grid":  # the grid covers every point anyway
            for params in warm_start_points(store, profile.name, options.template, problem, options.warm_start,
                                            manifest):
                study.enqueue_trial(params, skip_if_exists=True)
    study.set_user_attr(ATTR_BUDGET, budget)
    return study, budget


def _validate(options: SearchOptions) -> None:
    if options.sampler not in SAMPLERS:
        raise TunerError(f"unknown sampler {options.sampler!r}; expected one of {', '.join(SAMPLERS)}")
    if options.backend not in BACKENDS:
        raise TunerError(f"unknown backend {options.backend!r}; expected one of {', '.join(BACKENDS)}")
    if options.trials is not None and options.trials < 1:
        raise TunerError(f"--trials must be a positive integer, got {options.trials}")
    if options.time_budget_s is not None and options.time_budget_s <= 0:
        raise TunerError("--time-budget must be positive")
    if not options.devices or len(set(options.devices)) != len(options.devices):
        raise TunerError("--devices must list distinct device indices, e.g. 0,1")
    if options.profile_top < 0:
        raise TunerError("--profile-top must not be negative")
    if options.backend == "replay" and not options.replay_from:
        raise TunerError("--backend replay needs --from DB_URL (a results store recorded on a GPU)")


def _resolve(options: SearchOptions) -> GpuProfile:
    if options.backend == "replay":
        from tuner.replay import recording_profile

        return recording_profile(options.replay_from) if options.gpu.strip().lower() == "auto" else load_profile(options.gpu)
    _require_gpus(options.devices)
    return resolve_profile(options.gpu, force=options.force, device=options.devices[0])


def run_search(options: SearchOptions, console: Optional[Console] = None,
               backend_factory: Optional[Callable[[int, GpuProfile], Backend]] = None) -> SearchReport:
    """Tune every problem of `options`; prints progress on `console`, returns the summary as data.

    `backend_factory(device, profile)` replaces the backend (tests); it needs a single device.
    """
    console = console or Console(stderr=True)
    _validate(options)
    profile = _resolve(options)
    manifest = load_manifest(options.template)
    say = lambda text: console.print(text, markup=False, highlight=False, soft_wrap=True)  # noqa: E731
    problems = problems_of(options, profile, manifest, say)
    db_url = options.db_url or default_db_url()
    storage = storage_for(db_url)
    with open_store(db_url) as store:
        studies, budgets = [], []
        for problem in problems:
            name = _study_name_for(options, profile, problem, len(problems) > 1)
            study, budget = _prepare_study(options, storage, store, profile, manifest, problem, name)
            studies.append(study)
            budgets.append(budget)
        done = [finished_trials(s) for s in studies]
        remaining = [None if b is None else max(b - d, 0) for b, d in zip(budgets, done)]
        start = _now()
        slice_s = options.time_budget_s / len(problems) if options.time_budget_s else None
        specs = []
        for w, device in enumerate(options.devices):
            jobs = tuple(
                WorkerJob(i, s.study_name, None if r is None else split_budget(r, len(options.devices))[w],
                          None if slice_s is None else start + (i + 1) * slice_s)
                for i, (s, r) in enumerate(zip(studies, remaining))
            )
            specs.append(WorkerSpec(w, device, db_url, db_url, options.backend, jobs, options.replay_from,
                                    options.force, options.seed))
        with SearchProgress(console) as progress:
            for i, problem in enumerate(problems):
                progress.add_problem(i, problem, budgets[i], done[i])
            if len(specs) == 1:
                stop = threading.Event()
                with _StopOnSigint(stop, say):
                    results = [run_worker(specs[0], progress.handle, stop, backend_factory)]
            else:
                if backend_factory is not None:
                    raise TunerError("a backend factory serves one device only")
                results = _run_processes(specs, progress, say)
        run_ids = [r.run_id for r in results if r.run_id is not None]
        if options.profile_top and run_ids:
            _profile_top(store, run_ids, options.profile_top)
        summaries = [summarize(load_study(storage, s.study_name), p, store, run_ids) for s, p in zip(studies, problems)]
    return SearchReport(
        summaries=summaries,
        run_ids=run_ids,
        studies=[s.study_name for s in studies],
        interrupted=any(r.interrupted for r in results),
        measured=sum(r.measured for r in results),
        reused=sum(r.reused for r in results),
        asked=sum(r.asked for r in results),
    )


def _run_processes(specs: list[WorkerSpec], progress: SearchProgress, say: Callable[[str], None]) -> list[WorkerResult]:
    """One worker process per device; their events drive the progress bars."""
    ctx = multiprocessing.get_context("spawn")
    events, stop = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_child_main, args=(spec, events, stop), name=f"tuner-worker-{spec.device}")
             for spec in specs]
    results: dict[int, WorkerResult] = {}
    errors: list[str] = []
    with _StopOnSigint(stop, say):
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


def _profile_top(store: Store, run_ids: list[int], k: int) -> None:
    from tuner.profiling import profile_top

    for run_id in run_ids:
        profile_top(store, run_id, k)


# --- `tuner worker`: join a study from another host ---------------------------------------------


def run_join(studies: list[str], storage_url: str, *, db_url: Optional[str] = None, backend: str = "gpu",
             replay_from: Optional[str] = None, trials: Optional[int] = None, device: int = 0,
             time_budget_s: Optional[float] = None, seed: Optional[int] = None, force: bool = False,
             console: Optional[Console] = None) -> SearchReport:
    """Work on existing studies (created by `tuner search`) from this host, until their budgets are spent."""
    console = console or Console(stderr=True)
    if backend not in BACKENDS:
        raise TunerError(f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    if backend == "gpu":
        _require_gpus((device,))
    storage = storage_for(storage_url)
    if db_url is None:
        db_url = storage_url if "://" in storage_url and not storage_url.startswith("sqlite") else default_db_url()
    loaded = [load_study(storage, name) for name in studies]
    infos = [study_info(s) for s in loaded]
    if len({i.profile for i in infos}) > 1:
        raise TunerError("a worker serves one GPU profile; these studies name several")
    jobs = []
    deadline = _now() + time_budget_s if time_budget_s else None
    for i, (study, info) in enumerate(zip(loaded, infos)):
        left = trials if trials is not None else (None if info.budget is None else max(info.budget - finished_trials(study), 0))
        if left is None and deadline is None:
            raise TunerError(f"study {info.name!r} has no trial budget: give --trials or --time-budget")
        jobs.append(WorkerJob(i, info.name, left, deadline))
    spec = WorkerSpec(0, device, db_url, storage_url, backend, tuple(jobs), replay_from, force, seed)
    say = lambda text: console.print(text, markup=False, highlight=False, soft_wrap=True)  # noqa: E731
    with SearchProgress(console) as progress:
        for job, info in zip(jobs, infos):
            progress.add_problem(job.index, info.problem, job.trials)
        stop = threading.Event()
        with _StopOnSigint(stop, say):
            result = run_worker(spec, progress.handle, stop)
    with open_store(db_url) as store:
        run_ids = [result.run_id] if result.run_id is not None else []
        summaries = [summarize(load_study(storage, i.name), i.problem, store, run_ids) for i in infos]
    return SearchReport(summaries, run_ids, [i.name for i in infos], result.interrupted, result.measured,
                        result.reused, result.asked)
