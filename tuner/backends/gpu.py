"""The GPU backend: verify and time compiled variants in a worker process.

A kernel that faults (illegal address) leaves its CUDA context unusable, and
one that hangs never returns, so kernels never run in the tuner's own
process. `GpuBackend` (the parent side) starts a child with the `spawn`
method; the child binds PyCUDA to torch's primary context
(tuner.runtime.driver.cuda_driver) and answers requests sent over a Pipe:

    parent -> child                         child -> parent
    ("facts", {})                           ("phase", name, long)*  then
    ("baselines", {problem, range_prefix})  ("result", data)        success, or a wrong result
    ("measure", {problem, variant_name,     ("error", message)      a bad request; the child lives on
      cubin_path, launch (LaunchShape     ("fault", message)      the context is gone: the child exits
      fields), range_prefix})
    ("stop", {})

Every message holds plain picklable data (Problem is a frozen dataclass).
Before each phase (prepare, verify, time) the child reports it, and the
parent waits at most `watchdog_s` for the next message, plus the timing
budget for phases that time (`long`). When that expires the child is killed
(SIGKILL) and the request becomes a `timeout`; after a fault it becomes a
`launch_error`. Either way the next request starts a fresh child, so the
search goes on.

The child's work sits behind a small Runner interface (`CudaRunner` is the
real one), so the protocol, the watchdog and the restarts are tested on a
machine without a GPU with fake runners.
"""

from __future__ import annotations

import importlib.util
import math
import multiprocessing
import os
import random
import shutil
import subprocess
import time
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from tuner.kernels.compiler import CompileResult
from tuner.errors import NoGpuError, TunerError
from tuner.backends.base import BaselineMeasurement, DeviceFacts, Measurement
from tuner.runtime.nvtx import annotate, range_name
from tuner.problem import Problem
from tuner.profiles import GpuProfile
from tuner.kernels.variant import Variant
from tuner.store.records import TrialStatus

__all__ = ["CudaRunner", "GpuBackend", "Progress", "RequestError", "Runner", "WorkerFault"]

Progress = Callable[..., None]  # progress(phase: str, long: bool = False)


class RequestError(Exception):
    """A request the child cannot serve (e.g. a missing cubin); its CUDA context is still fine."""


class WorkerFault(Exception):
    """The CUDA context is unusable (illegal address, launch failure): the child must exit."""


class Runner(Protocol):
    """What the child process does; the default is CudaRunner."""

    def setup(self) -> None: ...

    def facts(self) -> dict[str, Optional[str]]: ...

    def baselines(self, problem: Problem, range_prefix: str, progress: Progress) -> list[dict[str, Any]]: ...

    def measure(self, request: dict[str, Any], progress: Progress) -> dict[str, Any]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class RunnerOptions:
    """Everything the child's runner is built from (picklable)."""

    device: int = 0
    l2_bytes: int = 64 << 20
    seed: Optional[int] = None
    refresh_every: int = 20  # fresh inputs and reference for a problem after this many measurements


# ---------------------------------------------------------------------------------------------
# The real runner (child side)


def _fault_text(exc: BaseException) -> str:
    """`Type: first line of the message` (torch appends paragraphs of debugging advice)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else '(no message)'}"[:1000]


class CudaRunner:
    """Loads cubins with PyCUDA and verifies and times them against torch tensors."""

    def __init__(self, options: RunnerOptions) -> None:
        self.options = options
        self._rng = random.Random(options.seed)
        self._inputs: OrderedDict[Problem, dict[str, Any]] = OrderedDict()

    def setup(self) -> None:
        from tuner.runtime.driver import cuda_driver

        cuda_driver(self.options.device)

    def facts(self) -> dict[str, Optional[str]]:
        import torch

        device = self.options.device
        props = torch.cuda.get_device_properties(device)
        uuid = getattr(props, "uuid", None)
        uuid_text = None if uuid is None else str(uuid)
        if uuid_text and not uuid_text.startswith("GPU-"):
            uuid_text = "GPU-" + uuid_text
        return {
            "gpu_name": torch.cuda.get_device_name(device),
            "gpu_uuid": uuid_text,
            "driver": _driver_version(),
            "cuda_version": torch.version.cuda,
        }

    def _problem_inputs(self, problem: Problem) -> dict[str, Any]:
        """q, k, v and the fp32 reference, fresh after `refresh_every` uses (a new seed each time)."""
        from tuner.runtime.verify import make_inputs, reference

        entry = self._inputs.get(problem)
        if entry is not None and entry["uses"] < self.options.refresh_every:
            self._inputs.move_to_end(problem)
            entry["uses"] += 1
            return entry
        self._inputs.pop(problem, None)
        while len(self._inputs) >= 2:  # a big problem's inputs and reference take hundreds of MB
            self._inputs.popitem(last=False)
        seed = self._rng.randrange(1 << 62)
        q, k, v = make_inputs(problem, "cuda", seed)
        scale = 1.0 / math.sqrt(problem.head_dim)
        ref, _ = reference(q, k, v, problem.causal, scale)
        entry = {"q": q, "k": k, "v": v, "ref": ref, "scale": scale, "seed": seed, "uses": 1}
        self._inputs[problem] = entry
        return entry

    def measure(self, request: dict[str, Any], progress: Progress) -> dict[str, Any]:
        import torch

        from tuner.runtime.timing import time_cuda
        from tuner.runtime.driver import AttentionKernel, LaunchShape
        from tuner.runtime.verify import TOLERANCE, empty_output, relative_error

        problem: Problem = request["problem"]
        name: str = request["variant_name"]
        prefix: str = request.get("range_prefix") or ""
        try:
            cubin = Path(request["cubin_path"]).read_bytes()  # closes the file (open().read() leaked it)
        except OSError as exc:
            raise RequestError(f"cannot read the cubin of {name}: {exc}") from None
        progress("prepare", True)
        with annotate(range_name(prefix, name, "prepare")):
            data = self._problem_inputs(problem)
            shape = LaunchShape(**request["launch"])
            kernel = AttentionKernel(cubin, name, shape, self.options.device)
            q, k, v, scale = data["q"], data["k"], data["v"], data["scale"]
            out = empty_output(q)
            torch.cuda.synchronize()
        progress("verify")
        with annotate(range_name(prefix, name, "verify")):
            kernel(q, k, v, out, None, scale)
            torch.cuda.synchronize()
        err = relative_error(out, data["ref"])
        base = {"rel_error": err if math.isfinite(err) else None, "seed": data["seed"], "registers": kernel.registers}
        if not math.isfinite(err) or err >= TOLERANCE[problem.dtype]:
            why = "NaN/inf or unwritten elements in the output" if not math.isfinite(err) else \
                f"relative error {err:.3e} >= tolerance {TOLERANCE[problem.dtype]:g}"
            return {**base, "status": "incorrect", "error": why}
        progress("time", True)
        with annotate(range_name(prefix, name, "time")):
            # Inputs were validated by the verify launch: time the launch alone, without
            # ~10 us of Python checks per call that small kernels would otherwise pay.
            timing = time_cuda(lambda: kernel.launch_unchecked(q, k, v, out, None, scale),
                               l2_bytes=self.options.l2_bytes)
        return {**base, "status": "ok", "median_us": timing.median_us, "p20_us": timing.p20_us,
                "p80_us": timing.p80_us, "reps": timing.reps}

    def baselines(self, problem: Problem, range_prefix: str, progress: Progress) -> list[dict[str, Any]]:
        from tuner.runtime.baselines import available_baselines

        progress("prepare", True)
        data = self._problem_inputs(problem)
        found = available_baselines(problem, data["q"], data["k"], data["v"], data["scale"])
        results = []
        for baseline in found:
            progress(f"{baseline.name}/time", True)
            with annotate(range_name(range_prefix, baseline.name, "time")):
                timing = baseline.time(l2_bytes=self.options.l2_bytes)
            results.append({"impl": baseline.name, "median_us": timing.median_us, "p20_us": timing.p20_us,
                            "p80_us": timing.p80_us})
        return results

    def close(self) -> None:
        self._inputs.clear()


def _driver_version() -> Optional[str]:
    """The NVIDIA driver version (e.g. 580.65.06) from nvidia-smi, else the CUDA driver API version."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20, check=False).stdout.strip()
            if out:
                return out.splitlines()[0].strip()
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        import pycuda.driver as drv

        version = drv.get_driver_version()  # e.g. 13000 for CUDA 13.0
        return f"cuda {version // 1000}.{version % 1000 // 10}"
    except Exception:  # noqa: BLE001 - a missing fact is not an error
        return None


def _default_runner(options: RunnerOptions) -> Runner:
    return CudaRunner(options)


# ---------------------------------------------------------------------------------------------
# Child process


def _child_main(conn: Any, runner_factory: Callable[[RunnerOptions], Runner], options: RunnerOptions) -> None:
    """The worker's loop. Exits with os._exit after a fault: never pop a broken CUDA context."""
    import signal

    # Ctrl-C reaches the whole process group: the parent decides (it stops or kills us),
    # so that an interrupted search does not record a bogus launch error.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        runner = runner_factory(options)
        runner.setup()
    except NoGpuError as exc:
        conn.send(("nogpu", str(exc)))
        conn.close()
        os._exit(1)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises
        conn.send(("error", _fault_text(exc)))
        conn.close()
        os._exit(1)
    conn.send(("ready", None))

    def progress(phase: str, long: bool = False) -> None:
        conn.send(("phase", phase, bool(long)))

    while True:
        try:
            op, args = conn.recv()
        except (EOFError, OSError):  # the parent went away
            os._exit(0)
        if op == "stop":
            break
        try:
            if op == "facts":
                result: Any = runner.facts()
            elif op == "baselines":
                result = runner.baselines(args["problem"], args.get("range_prefix") or "", progress)
            elif op == "measure":
                result = runner.measure(args, progress)
            else:
                raise RequestError(f"unknown request {op!r}")
        except RequestError as exc:
            conn.send(("error", str(exc)))
            continue
        except BaseException as exc:  # noqa: BLE001 - CUDA errors, and anything else: the context is suspect
            try:
                conn.send(("fault", _fault_text(exc)))
                conn.close()
            finally:
                os._exit(3)
        conn.send(("result", result))
    try:
        runner.close()
    finally:
        conn.close()


# ---------------------------------------------------------------------------------------------
# Parent side


class _Refused(TunerError):
    """The child answered a request with an error (e.g. an unreadable cubin) and lives on."""


class _Timeout(Exception):
    def __init__(self, phase: str, seconds: float) -> None:
        super().__init__(f"no reply from the GPU worker within {seconds:.1f} s (phase {phase}); worker killed")
        self.phase = phase


class _Fault(Exception):
    pass


class _Worker:
    """One child process and its end of the pipe."""

    def __init__(self, factory: Callable[[RunnerOptions], Runner], options: RunnerOptions, start_timeout_s: float) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child_conn = ctx.Pipe()
        self.process = ctx.Process(target=_child_main, args=(child_conn, factory, options), daemon=True,
                                   name="tuner-gpu-worker")
        self.process.start()
        child_conn.close()
        if not self.conn.poll(start_timeout_s):
            self.kill()
            raise TunerError(f"the GPU worker did not start within {start_timeout_s:.0f} s")
        try:
            kind, message = self.conn.recv()
        except (EOFError, OSError):
            self.kill()
            raise TunerError(f"the GPU worker died while starting (exit code {self.process.exitcode})") from None
        if kind == "nogpu":
            self.kill()
            raise NoGpuError(message)
        if kind != "ready":
            self.kill()
            raise TunerError(f"the GPU worker could not start: {message}")

    @property
    def pid(self) -> Optional[int]:
        return self.process.pid

    def request(self, op: str, args: dict[str, Any], watchdog_s: float, long_budget_s: float) -> Any:
        """Send one request, wait for its reply; _Timeout or _Fault leave this worker dead."""
        try:
            self.conn.send((op, args))
        except (OSError, ValueError) as exc:
            self.kill()
            raise _Fault(f"the GPU worker is gone ({exc})") from None
        phase, budget = "start", watchdog_s
        deadline = time.monotonic() + budget
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self.conn.poll(remaining):
                self.kill()
                raise _Timeout(phase, budget)
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                self.kill()
                raise _Fault(f"the GPU worker died (exit code {self.process.exitcode}) in phase {phase}") from None
            kind = message[0]
            if kind == "phase":
                phase, long = message[1], message[2]
                budget = watchdog_s + (long_budget_s if long else 0.0)
                deadline = time.monotonic() + budget
            elif kind == "result":
                return message[1]
            elif kind == "error":
                raise _Refused(message[1])
            elif kind == "fault":
                self.process.join(10)
                self.kill()
                raise _Fault(f"{message[1]} (phase {phase})")
            else:
                self.kill()
                raise _Fault(f"unexpected message from the GPU worker: {kind!r}")

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()  # SIGKILL: a hung kernel ignores anything gentler
        self.process.join(30)
        self.conn.close()

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process.is_alive():
            try:
                self.conn.send(("stop", {}))
            except (OSError, ValueError):
                pass
            self.process.join(timeout_s)
        self.kill()


def _check_gpu_environment() -> None:
    try:
        import torch
    except ImportError:
        raise NoGpuError("torch is not installed") from None
    if not torch.cuda.is_available():
        raise NoGpuError("no CUDA GPU is visible to torch on this machine")
    if importlib.util.find_spec("pycuda") is None:
        raise NoGpuError("pycuda is not installed; install the gpu extra: pip install 'flashcore-tuner[gpu]'")


class GpuBackend:
    """The Backend (tuner.backends.base) that measures on a real GPU, in a worker process.

    `runner` builds the child's Runner from RunnerOptions (a picklable,
    module-level callable); tests pass fakes. Only with the default runner
    does construction check for torch.cuda and pycuda (NoGpuError).
    """

    needs_compile = True

    def __init__(self, profile: GpuProfile, device: int = 0, watchdog_s: float = 10.0, seed: Optional[int] = None,
                 *, runner: Optional[Callable[[RunnerOptions], Runner]] = None, timing_budget_s: float = 60.0,
                 start_timeout_s: float = 300.0, refresh_every: int = 20, range_prefix: str = "") -> None:
        if runner is None:
            _check_gpu_environment()
        if watchdog_s <= 0 or timing_budget_s < 0:
            raise TunerError("watchdog_s must be positive and timing_budget_s non-negative")
        self.profile = profile
        self.device = device
        self.watchdog_s = float(watchdog_s)
        self.timing_budget_s = float(timing_budget_s)
        self.start_timeout_s = float(start_timeout_s)
        self.range_prefix = range_prefix  # the search sets e.g. "run3/trial17" before each measure
        self.restarts = 0  # children replaced after a fault or a timeout
        self._factory = runner or _default_runner
        self._options = RunnerOptions(device=device, l2_bytes=profile.l2_bytes, seed=seed, refresh_every=refresh_every)
        self._worker: Optional[_Worker] = None
        self._facts: Optional[DeviceFacts] = None
        self._closed = False

    # --- worker management -----------------------------------------------------------------

    @property
    def worker_pid(self) -> Optional[int]:
        return self._worker.pid if self._worker is not None else None

    def _ensure_worker(self) -> _Worker:
        if self._closed:
            raise TunerError("the GPU backend is closed")
        if self._worker is None or not self._worker.process.is_alive():
            if self._worker is not None:
                self._worker.kill()
            self._worker = _Worker(self._factory, self._options, self.start_timeout_s)
        return self._worker

    def _request(self, op: str, args: dict[str, Any]) -> Any:
        worker = self._ensure_worker()
        try:
            return worker.request(op, args, self.watchdog_s, self.timing_budget_s)
        except (_Timeout, _Fault):
            self._worker = None  # dead: the next request starts a fresh child
            self.restarts += 1
            raise
        except TunerError:
            raise  # a refused request: the child is fine
        except BaseException:
            # Interrupted while a reply was pending (Ctrl-C): the pipe is out of step, start over.
            worker.kill()
            self._worker = None
            raise

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
        return [BaselineMeasurement(r["impl"], r["median_us"], r["p20_us"], r["p80_us"]) for r in rows]

    def measure(self, problem: Problem, variant: Variant, compiled: CompileResult, *,
                range_prefix: Optional[str] = None) -> Measurement:
        from dataclasses import asdict

        from tuner.kernels.feasibility import launch_shape

        if not compiled.ok or compiled.cubin_path is None:
            raise TunerError(f"{variant.name} has no cubin to measure (compile failed)")
        request = {
            "problem": problem,
            "variant_name": compiled.entry,
            "cubin_path": str(compiled.cubin_path),
            "launch": asdict(launch_shape(variant)),
            "range_prefix": self.range_prefix if range_prefix is None else range_prefix,
        }
        return self.measure_request(request)

    def measure_request(self, request: dict[str, Any]) -> Measurement:
        """measure() from a ready request dict (what goes over the pipe)."""
        try:
            reply = self._request("measure", request)
        except _Timeout as exc:
            return Measurement(TrialStatus.TIMEOUT, error=str(exc))
        except _Fault as exc:
            return Measurement(TrialStatus.LAUNCH_ERROR, error=str(exc))
        except _Refused as exc:  # e.g. the cubin vanished from the cache: this trial failed, not the search
            return Measurement(TrialStatus.LAUNCH_ERROR, error=str(exc))
        status = TrialStatus(reply["status"])
        return Measurement(status, reply.get("median_us"), reply.get("p20_us"), reply.get("p80_us"),
                           reply.get("rel_error"), reply.get("error"))

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
