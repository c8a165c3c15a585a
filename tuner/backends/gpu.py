"""The GPU backend: verify and time built variants in a worker process (the parent side).

A kernel that faults (illegal address) leaves its CUDA context unusable, and
one that hangs never returns, so kernels never run in the tuner's own
process. `GpuBackend` (the parent side) starts a child with the `spawn`
method; the child binds PyCUDA to torch's primary context
(tuner.runtime.driver.cuda_driver) and answers requests sent over a Pipe:

    parent -> child                         child -> parent
    ("facts", {})                           ("phase", name, kind)*  then
    ("baselines", {problem, range_prefix})  ("result", data)        success, or a wrong result
    ("measure", {problem, built,            ("error", message)      a bad request; the child lives on
      range_prefix})                        ("fault", message)      the context is gone: the child exits
    ("confirm", {problem, builts, rounds,   ("spent", {part: seconds})  before a result: its fixed costs
      baselines, first_round,                                       (inputs, reference, verification, ...)
      energy_pass})
    ("stop", {})

Each timing in a result is one tuner.runtime.timed.Timing, sent whole: a measure result's "timing", each
baseline's "timing", each implementation's Timing per round of a confirm result. Its energy is read where
it decides (runtime.objective.metered: a confirm request's energy_pass; every timing under --objective energy),
else None; for --objective isolated it carries `isolated_us`. At start-up the child answers ("ready", None),
or ("refused", message) for options it cannot serve (--objective energy without NVML), or ("nogpu"/"error", message).

Every message holds plain picklable data (Problem and BuiltKernel are frozen
dataclasses; a BuiltKernel travels without its source, the child reads the
cubin from the compile cache).
Before each phase (prepare, verify, check, time) the child reports it with its kind
(tuner.backends.phases), and the parent waits for the next message at most: `watchdog_s` for a kernel's
own launch (verify: the checked launch and its synchronize, nothing else); that plus the timing budget for
phases that time; and for set-up work (prepare: the problem's inputs and fp32 reference, the cubin's load;
check: the error against the reference and the inputs' checksum; the baselines' imports and first calls)
a limit of its own that grows with the problem (`setup_timeout_s` plus the reference's work,
runtime.fixed_costs.setup_seconds): a 4.5 s reference at S16384 is set-up, not a hung kernel. When a limit
expires the child is killed (SIGKILL) and the request becomes a `timeout`; after a fault it becomes a
`launch_error`. Either way the next request starts a fresh child, so the search goes on.

The child (tuner.backends.gpu_child) does its work behind a small Runner
interface (`CudaRunner` is the real one), so the protocol, the watchdog and
the restarts are tested on a machine without a GPU with fake runners.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Any, Callable, Collection, Optional

from tuner.backends.base import (
    BaselineMeasurement,
    ConfirmTimings,
    DeviceFacts,
    Measured,
    Measurement,
    PendingMeasurement,
)
from tuner.backends.gpu_child import Runner, RunnerOptions, default_runner
from tuner.backends.gpu_process import (
    _Fault,
    _Refused,
    _Timeout,
    _Worker,
    adopt_prestarted,
    check_gpu_environment,
    runner_options,
)
from tuner.errors import TunerError
from tuner.kernels.variant import Variant
from tuner.problem import Problem
from tuner.profiles import GpuProfile
from tuner.runtime.build import BuiltKernel
from tuner.runtime.fixed_costs import setup_seconds
from tuner.status import TrialStatus

RESTART = "restarting the GPU worker"  # a fixed cost of the parent side: a fresh child after a fault or a timeout

# ---------------------------------------------------------------------------------------------
# Parent side


class _GpuMeasurement:
    """A measurement sent to the GPU worker; result() collects the reply (once)."""

    def __init__(self, backend: "GpuBackend", worker: _Worker) -> None:
        self._backend, self._worker = backend, worker
        self._result: Optional[Measurement] = None
        self._sent = time.perf_counter()
        self.seconds = 0.0

    def result(self) -> Measurement:
        if self._result is None:
            if self._backend._pending is self:
                self._backend._pending = None
            self._result = self._backend._measurement(lambda: self._backend._receive(self._worker))
            self.seconds = time.perf_counter() - self._sent
        return self._result


class GpuBackend:
    """The Backend (tuner.backends.base) that measures on a real GPU, in a worker process.

    `runner` builds the child's Runner from RunnerOptions (a picklable,
    module-level callable); tests pass fakes. Only with the default runner
    does construction check for torch.cuda and pycuda (NoGpuError).
    """

    needs_compile = True

    def __init__(self, profile: GpuProfile, device: int = 0, watchdog_s: float = 10.0, seed: Optional[int] = None,
                 *, runner: Optional[Callable[[RunnerOptions], Runner]] = None, timing_budget_s: float = 60.0,
                 start_timeout_s: float = 300.0, range_prefix: str = "", objective: str = "time",
                 setup_timeout_s: Optional[float] = None) -> None:
        if runner is None:
            check_gpu_environment()
        if watchdog_s <= 0 or timing_budget_s < 0:
            raise TunerError("watchdog_s must be positive and timing_budget_s non-negative")
        self.profile = profile
        self.device = device
        self.watchdog_s = float(watchdog_s)
        self.timing_budget_s = float(timing_budget_s)
        self.start_timeout_s = float(start_timeout_s)
        # A set-up phase's limit before its problem's share (None: the start's; setup_limit_s)
        self.setup_timeout_s = float(start_timeout_s if setup_timeout_s is None else setup_timeout_s)
        self.range_prefix = range_prefix  # NVTX prefix of baselines, and of measures given none
        self.restarts = 0  # children replaced after a fault or a timeout
        self._factory = runner or default_runner
        self._options = runner_options(profile, device, seed, objective)  # objective: see gpu_child
        self._worker: Optional[_Worker] = None
        self._spent: dict[tuple[Optional[str], str], float] = {}  # fixed_costs(), shared with each child in turn
        self._started = False  # a child was ready once: a later start is a restart
        self._facts: Optional[DeviceFacts] = None
        self._pending: Optional[_GpuMeasurement] = None  # submitted, reply not collected yet
        self._closed = False

    # --- worker management -----------------------------------------------------------------

    @property
    def worker_pid(self) -> Optional[int]:
        return self._worker.pid if self._worker is not None else None

    def _ensure_worker(self) -> _Worker:
        if self._closed:
            raise TunerError("the GPU backend is closed")
        started, fresh = time.perf_counter(), False
        if self._worker is None or not self._worker.process.is_alive():
            if self._worker is not None:
                self._worker.kill()
            self._worker = adopt_prestarted(self._options, self._factory) or _Worker(self._factory, self._options)
            self._worker.spent, fresh = self._spent, True
        try:
            self._worker.wait_ready(self.start_timeout_s)
        except BaseException:
            worker, self._worker = self._worker, None
            worker.kill()  # already done where the start failed; an interrupt leaves it running
            raise
        if fresh and self._started:  # after a fault or a timeout, before the next request: no request's time
            self._spent[(None, RESTART)] = self._spent.get((None, RESTART), 0.0) + time.perf_counter() - started
        self._started = True
        return self._worker

    def fixed_costs(self) -> dict[tuple[Optional[str], str], float]:
        """Seconds of the GPU worker's fixed costs so far by (request, part): the child's inputs, reference,
        verification and baseline set-up within its "measure", "baselines" and "confirm" requests, and
        (None, RESTART) for its restarts after faults and timeouts (between requests)."""
        return dict(self._spent)

    def setup_limit_s(self, problem: Optional[Problem]) -> float:
        """How long one set-up phase of a request on `problem` may take (inputs, reference, error, baselines'
        set-up): setup_timeout_s, plus the reference's work on the problem (fixed_costs.setup_seconds)."""
        return self.setup_timeout_s if problem is None else setup_seconds(problem, self.setup_timeout_s)

    def _request(self, op: str, args: dict[str, Any]) -> Any:
        return self._receive(self._send(op, args))

    def _send(self, op: str, args: dict[str, Any]) -> _Worker:
        """Send a request to the worker (collecting an outstanding reply first); _Fault when it is gone."""
        self._settle()
        worker = self._ensure_worker()
        try:
            worker.send(op, args, self.setup_limit_s(args.get("problem")))
        except _Fault:
            self._lost()
            raise
        return worker

    def _receive(self, worker: _Worker) -> Any:
        try:
            return worker.receive(self.watchdog_s, self.timing_budget_s)
        except (_Timeout, _Fault):
            self._lost()  # dead: the next request starts a fresh child
            raise
        except TunerError:
            raise  # a refused request: the child is fine
        except BaseException:
            # Interrupted while a reply was pending (Ctrl-C): the pipe is out of step, start over.
            worker.kill()
            self._worker = None
            raise

    def _lost(self) -> None:
        self._worker = None
        self.restarts += 1

    def _settle(self) -> None:
        """Collect the reply of a submitted measurement nobody waited for, so the pipe stays in step."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    # --- Backend protocol ------------------------------------------------------------------

    def device_facts(self) -> DeviceFacts:
        if self._facts is None:
            try:
                facts = self._request("facts", {})
            except (_Timeout, _Fault) as exc:
                raise TunerError(f"cannot read the GPU's facts: {exc}") from None
            self._facts = DeviceFacts(**facts)
        return self._facts

    def baselines(self, problem: Problem) -> list[BaselineMeasurement]:
        try:
            rows = self._request("baselines", {"problem": problem, "range_prefix": self.range_prefix})
        except (_Timeout, _Fault) as exc:
            warnings.warn(f"baselines of {problem.label} failed: {exc}", RuntimeWarning, stacklevel=2)
            return []
        return [BaselineMeasurement(r["impl"], r["timing"], warnings=r.get("warnings", 0)) for r in rows]

    def measure(self, problem: Problem, variant: Variant, built: Optional[BuiltKernel], *,
                range_prefix: Optional[str] = None) -> Measurement:
        return self.submit_measure(problem, variant, built, range_prefix=range_prefix).result()

    def submit_measure(self, problem: Problem, variant: Variant, built: Optional[BuiltKernel], *,
                       range_prefix: Optional[str] = None) -> PendingMeasurement:
        """Send the measurement to the GPU worker and return at once; result() waits for the reply
        (the watchdog's clock starts there, and restarts with each phase the child reports)."""
        if built is None or not built.ok or built.compiled.cubin_path is None:
            raise TunerError(f"{variant.name} has no cubin to measure (compile failed)")
        request = {
            "problem": problem,
            "built": dataclasses.replace(built, source=""),  # the child needs the cubin's path, not the source
            "range_prefix": self.range_prefix if range_prefix is None else range_prefix,
        }
        try:
            worker = self._send("measure", request)
        except _Fault as exc:
            return Measured(Measurement(TrialStatus.LAUNCH_ERROR, error=str(exc)))
        self._pending = _GpuMeasurement(self, worker)
        return self._pending

    def measure_request(self, request: dict[str, Any]) -> Measurement:
        """measure() from a ready request dict (what goes over the pipe)."""
        return self._measurement(lambda: self._request("measure", request))

    @staticmethod
    def _measurement(reply_of: Callable[[], Any]) -> Measurement:
        """The Measurement of a measure request's reply; a dead or refusing worker fails the trial, not the search."""
        try:
            reply = reply_of()
        except _Timeout as exc:
            return Measurement(TrialStatus.TIMEOUT, error=str(exc))
        except _Fault as exc:
            return Measurement(TrialStatus.LAUNCH_ERROR, error=str(exc))
        except _Refused as exc:  # e.g. the cubin vanished from the cache
            return Measurement(TrialStatus.LAUNCH_ERROR, error=str(exc))
        status = TrialStatus(reply["status"])
        return Measurement(status, reply.get("timing"), reply.get("rel_error"), reply.get("error"))

    def confirm(self, problem: Problem, variants: list[Variant], builts: list[Optional[BuiltKernel]],
                rounds: int, *, baselines: Optional[Collection[str]] = None, first_round: int = 0,
                energy_pass: bool = False) -> ConfirmTimings:
        ready = [dataclasses.replace(b, source="") for b in builts if b is not None and b.ok]
        try:
            reply = self._request("confirm", {"problem": problem, "builts": ready, "rounds": rounds,
                                              "baselines": None if baselines is None else list(baselines),
                                              "first_round": first_round, "energy_pass": energy_pass})
        except (_Timeout, _Fault) as exc:
            raise TunerError(f"the confirm stage of {problem.label} failed: {exc}") from None
        return ConfirmTimings.of(reply)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.stop()
            self._worker = None
        self._closed = True

    def __enter__(self) -> "GpuBackend":
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        worker = getattr(self, "_worker", None)
        if worker is not None:
            try:
                worker.kill()
            except Exception:  # noqa: BLE001 - interpreter shutdown
                pass
