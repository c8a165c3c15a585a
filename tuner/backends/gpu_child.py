"""The GPU worker process: loads built kernels with PyCUDA, verifies and times them.

The parent side (tuner.backends.gpu.GpuBackend) starts this process with the
`spawn` method and sends requests over a Pipe (the protocol is described
there). The child's work sits behind a small Runner interface (`CudaRunner`
is the real one), so the protocol, the watchdog and the restarts are tested
on a machine without a GPU with fake runners.
"""

from __future__ import annotations

import math
import os
import random
import signal
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol

from tuner.backends.kernel_calls import kernel_call  # noqa: F401 - kernel_call: this module's API too
from tuner.backends.kernel_calls import layout_inputs, load_kernel, tolerance, trial_output
from tuner.backends.phases import KERNEL, SETUP, TIMED, phase_kind
from tuner.errors import NoGpuError, TunerError
from tuner.problem import Problem
from tuner.profiles.cuda_query import driver_version
from tuner.runtime.baseline_log import take_counts
from tuner.runtime.backward_trial import backward_baselines, backward_inputs
from tuner.runtime.baselines import available_baselines
from tuner.runtime.build import BuiltKernel
from tuner.runtime.driver import cuda_driver
from tuner.runtime.energy import EnergyMeter
from tuner.runtime.fixed_costs import (BASELINE_SETUP, CHECKSUM, INPUTS, KEPT_INPUTS, MODULE_LOAD, REFERENCE,
                                       VERIFICATION, PerInputs, Spent, await_baseline_imports, fingerprint,
                                       start_baseline_imports)  # fmt: skip
from tuner.runtime.nvtx import annotate, range_name
from tuner.runtime.objective import (BASELINE, CONFIRM, ENERGY, ISOLATED, TIME, TRIAL, ConfirmRounds, metered,
                                    timing_window)
from tuner.runtime.timing import Timing, interleaved_timings, time_call
from tuner.runtime.verify import expected_output, fp8_inputs, make_inputs

Progress = Callable[..., None]  # progress(phase, kind): what bounds it (tuner.backends.phases); True: TIMED


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
    # isolated: calls are also timed isolated; energy: every timing metered (objective.metered; else the confirm
    # stage's energy pass alone), refused at setup without NVML
    objective: str = TIME


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
        self._meter = EnergyMeter(options.device)
        self.spent = Spent(_sync_gpu)  # the fixed costs of each request, sent after it (child_main)
        self._baselines = PerInputs(KEPT_INPUTS)  # each problem's baselines, made once for its inputs

    def setup(self) -> None:
        cuda_driver(self.options.device)
        start_baseline_imports(self.options.device)  # FA4's import, seconds, while the first trials compile
        # NVML opens now, in the process that times: a missing one is logged before the first timing.
        if not self._meter.available and self.options.objective == ENERGY:
            raise TunerError(f"--objective energy needs NVML's energy counter on GPU {self.options.device}, "
                             f"which this machine does not give ({self._meter.why_not})")

    def _timing_options(self, stage: str, rounds: Optional[ConfirmRounds] = None) -> dict[str, Any]:
        """time_call's options for a timing of `stage` (objective.TRIAL, BASELINE, CONFIRM; a confirm timing in
        the round `rounds` is at): the energy meter where it decides (objective.metered), the stage's window
        (objective.timing_window); for --objective isolated, isolated calls too."""
        meter = rounds.metered if rounds is not None else metered(self.options.objective, stage)
        return {"meter": self._meter if meter else None, **timing_window(stage),
                "isolated_too": self.options.objective == ISOLATED, "l2_bytes": self.options.l2_bytes}

    def _time(self, fn: Callable[[], Any], stage: str) -> Timing:
        return time_call(fn, **self._timing_options(stage))

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
            "driver": driver_version(),
            "cuda_version": torch.version.cuda,
        }

    def _problem_inputs(self, problem: Problem) -> dict[str, Any]:
        """q, k, v and the fp32 reference, built once per problem (seconds at long sequences); an e4m3 problem's
        come with their Descales (entry["descales"]). Reused unchecked: a verify launch, a kernel's first on them,
        is followed by a checksum (_intact) that drops them if it wrote into them; timed launches repeat one found
        clean, and the baselines only read them."""
        entry = self._inputs.get(problem)
        if entry is not None:
            self._inputs.move_to_end(problem)
            return entry
        while len(self._inputs) >= KEPT_INPUTS:
            self._inputs.popitem(last=False)
        seed = self._rng.randrange(1 << 62)
        descales = None
        with self.spent.part(INPUTS):
            if problem.fp8:
                q, k, v, descales = fp8_inputs(problem, "cuda", seed)
            else:
                q, k, v = make_inputs(problem, "cuda", seed)
            entry = {"q": q, "k": k, "v": v, "scale": 1.0 / math.sqrt(problem.head_dim), "seed": seed,
                     **layout_inputs(problem, q, k, v, seed)}
        lengths = problem.key_lengths() if problem.ragged else None
        with self.spent.part(REFERENCE):  # on sampled rows at 128K; a backward's dO, O, lse and fp32 gradients
            if problem.backward:
                entry.update(backward_inputs(problem, q, k, v, entry["scale"], seed))
            else:
                entry["ref"] = expected_output(problem, q, k, v, entry["scale"], key_lengths=lengths,
                                               descales=descales)
        if descales is not None:
            entry["descales"] = descales
        entry["fingerprint"] = fingerprint(entry)
        self._inputs[problem] = entry
        return entry

    def _intact(self, problem: Problem, data: dict[str, Any]) -> bool:
        """Whether the problem's inputs and reference are as they were built. A kernel that writes past its
        output writes into torch's allocator memory (no fault), maybe into them: then they are dropped, that
        kernel is found wrong (checked after each verify launch) and the next variant gets fresh ones."""
        if fingerprint({k: v for k, v in data.items() if k != "fingerprint"}) == data["fingerprint"]:
            return True
        self._inputs.pop(problem, None)
        return False

    def measure(self, request: dict[str, Any], progress: Progress) -> dict[str, Any]:
        import torch

        problem: Problem = request["problem"]
        built: BuiltKernel = request["built"]
        name = built.entry
        prefix: str = request.get("range_prefix") or ""
        try:
            cubin = built.compiled.cubin
        except OSError as exc:
            raise RequestError(f"cannot read the cubin of {name}: {exc}") from None
        progress("prepare", SETUP)  # the inputs and reference (built once per problem), the cubin's load
        with annotate(range_name(prefix, name, "prepare")):
            data = self._problem_inputs(problem)
            with self.spent.part(MODULE_LOAD):  # waits for the GPU at its end
                kernel = load_kernel(built, problem, self.options.device, cubin)
                out = trial_output(problem, data)
        progress("verify", KERNEL)  # the watchdog bounds the kernel's own launch, nothing else
        with annotate(range_name(prefix, name, "verify")), self.spent.part(VERIFICATION):
            kernel_call(kernel, data, out, checked=True)()
            torch.cuda.synchronize()
        progress("check", SETUP)  # the error against the reference and the inputs' checksum: sized by the problem
        with self.spent.part(VERIFICATION):
            err = data["ref"].error(out)
        with self.spent.part(CHECKSUM):
            intact = self._intact(problem, data)
        base = {"rel_error": err if math.isfinite(err) else None, "seed": data["seed"], "registers": kernel.registers}
        why = _wrong(err, tolerance(problem), intact)
        if why is not None and problem.backward:  # which gradient
            why += f" ({data['ref'].describe(out)})"
        if why is not None:
            return {**base, "status": "incorrect", "error": why}
        with self.spent.part(BASELINE_SETUP):
            await_baseline_imports()  # no import thread left to slow the timed launches (the GIL); still "check"
        progress("time", TIMED)
        with annotate(range_name(prefix, name, "time")):
            # Inputs were validated by the verify launch: time the launch alone, without
            # ~10 us of Python checks per call that small kernels would otherwise pay.
            timing = self._time(kernel_call(kernel, data, out, checked=False), TRIAL)
        return {**base, "status": "ok", "timing": timing}

    def confirm(self, request: dict[str, Any], progress: Progress) -> dict[str, list[Timing]]:
        """Verified variants and the SDPA baselines asked for (None: every one), timed in interleaved
        rounds (the start rotates from round `first_round` on); `energy_pass`: the confirm stage's energy pass,
        whose timings read the energy meter (objective.metered; every round's do under --objective energy)."""
        import torch

        problem: Problem = request["problem"]
        wanted = request.get("baselines")
        rounds = ConfirmRounds(self.options.objective, int(request.get("first_round", 0)), int(request["rounds"]),
                               bool(request.get("energy_pass", False)))

        def start_round(r: int) -> None:
            rounds.start(r)
            progress(f"confirm/round{rounds.current}", TIMED)

        def options() -> dict[str, Any]:
            return self._timing_options(CONFIRM, rounds)

        progress("prepare", SETUP)
        data = self._problem_inputs(problem)
        calls: dict[str, Callable[[], Any]] = {}
        for built in request["builts"]:
            kernel, out = load_kernel(built, problem, self.options.device), trial_output(problem, data)
            progress(f"{built.entry}/verify", KERNEL)
            with self.spent.part(VERIFICATION):
                kernel_call(kernel, data, out, checked=True)()
                torch.cuda.synchronize()
            progress(f"{built.entry}/check", SETUP)
            with self.spent.part(VERIFICATION):
                ok = data["ref"].error(out) < tolerance(problem) and self._intact(problem, data)
            if ok:
                calls[built.entry] = lambda call=kernel_call(kernel, data, out, checked=False): time_call(call,
                                                                                                       **options())
        progress("baselines", SETUP)  # their imports awaited, their first calls (FA4's compile or cache load)
        for baseline in self._available_baselines(problem, data):
            if wanted is not None and baseline.name not in wanted:
                continue
            # A round times each implementation as a trial is timed (25 ms warm-up, 100 ms of repetitions):
            # 25 ms rounds gave ~8% lower µs on an H100 than 60-100 ms timings (boost clock before the
            # power limit bites), which would set the confirmed figures apart from every other figure.
            calls[baseline.name] = lambda baseline=baseline: baseline.time(**options())
        return interleaved_timings(calls, rounds.count, start_round, first_round=rounds.first)

    def baselines(self, problem: Problem, range_prefix: str, progress: Progress) -> list[dict[str, Any]]:
        progress("prepare", SETUP)  # the inputs and reference; the baselines' imports awaited, their first calls
        data = self._problem_inputs(problem)
        take_counts()  # count this request's warnings only
        found = self._available_baselines(problem, data)
        results = []
        for baseline in found:
            progress(f"{baseline.name}/time", TIMED)
            with annotate(range_name(range_prefix, baseline.name, "time")):
                timing = baseline.time(**self._timing_options(BASELINE))
            results.append({"impl": baseline.name, "timing": timing})
        logged = take_counts()  # written to the baselines' log: the search says where
        return [{**r, "warnings": logged.get(r["impl"], 0)} for r in results]

    def _available_baselines(self, problem: Problem, data: dict[str, Any]) -> list[Any]:
        """The baselines that run the problem (their imports awaited; their first calls compile FA4's kernel), made
        once for its inputs: the baselines request and every confirm round reuse them."""
        def make() -> list[Any]:
            await_baseline_imports()
            if problem.backward:
                return backward_baselines(problem, data)
            return available_baselines(problem, data["q"], data["k"], data["v"], data["scale"],
                                       descales=data.get("descales"))

        with self.spent.part(BASELINE_SETUP):
            return self._baselines.get(problem, data, make)

    def close(self) -> None:
        self._inputs.clear()
        self._baselines.clear()
        self._meter.close()


def _wrong(err: float, tol: float, intact: bool) -> Optional[str]:
    """Why a kernel whose output is `err` from the reference (tolerance `tol`) is incorrect (None: it is not)."""
    if not math.isfinite(err):
        return "NaN/inf or unwritten elements in the output"
    if err >= tol:
        return f"relative error {err:.3e} >= tolerance {tol:g}"
    return None if intact else "it wrote past its output, into the inputs or the reference"


def default_runner(options: RunnerOptions) -> Runner:
    return CudaRunner(options)


def _sync_gpu() -> None:
    """Wait for the GPU's queued work (a part's seconds are its own), where CUDA is in use."""
    import torch

    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------------
# Child process


def warm_up(runner_factory: Callable[[RunnerOptions], Runner], device: int) -> None:
    """What a child can do before it knows its options: the real runner's torch import and CUDA context
    (4-7 s on an H100 host), which its setup() then finds done."""
    if runner_factory is default_runner:
        cuda_driver(device)
        start_baseline_imports(device)


def child_main(conn: Any, runner_factory: Callable[[RunnerOptions], Runner], options: Optional[RunnerOptions],
               device: int = 0) -> None:
    """The worker's loop. Exits with os._exit after a fault: never pop a broken CUDA context.

    `options` None: the child was started before they were known (a search starting its GPU child before
    it has read its GPU profile); it warms up on `device`, then takes them from the first message."""
    # Ctrl-C reaches the whole process group: the parent decides (it stops or kills us),
    # so that an interrupted search does not record a bogus launch error.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        if options is None:
            warm_up(runner_factory, device)
            try:
                _, options = conn.recv()  # ("options", RunnerOptions)
            except (EOFError, OSError):  # the parent went away (or discarded us) before it needed us
                os._exit(0)
        runner = runner_factory(options)
        runner.setup()
    except NoGpuError as exc:
        conn.send(("nogpu", str(exc)))
        conn.close()
        os._exit(1)
    except TunerError as exc:  # a refusal the user reads as is (e.g. --objective energy without NVML)
        conn.send(("refused", str(exc)))
        conn.close()
        os._exit(1)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises
        conn.send(("error", _fault_text(exc)))
        conn.close()
        os._exit(1)
    try:
        conn.send(("ready", None))
    except OSError:  # the parent went away while we started (e.g. aborted): nothing to report to
        os._exit(0)

    def progress(phase: str, kind: Any = KERNEL) -> None:
        conn.send(("phase", phase, phase_kind(kind)))

    while True:
        try:
            op, args = conn.recv()
        except (EOFError, OSError):  # the parent went away
            os._exit(0)
        if op == "stop":
            break
        try:
            if op == "facts":
                progress("facts", SETUP)  # nvidia-smi may take longer than the watchdog (it waits up to 20 s)
                result: Any = runner.facts()
            elif op == "baselines":
                result = runner.baselines(args["problem"], args.get("range_prefix") or "", progress)
            elif op == "measure":
                result = runner.measure(args, progress)
            elif op == "confirm":
                result = runner.confirm(args, progress)  # type: ignore[attr-defined]
            else:
                raise RequestError(f"unknown request {op!r}")
            spent = getattr(runner, "spent", None)  # the request's fixed costs, by part (a fake runner has none)
            if spent is not None:
                conn.send(("spent", spent.take()))
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
