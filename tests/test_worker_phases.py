"""What the GPU worker's watchdog bounds (issue 38; the H200 run where a correct kernel came back a timeout in
phase verify): only a kernel's own launch. Set-up work (the problem's inputs and fp32 reference, the error
against it, the inputs' checksum) runs in phases of its own, with a limit that grows with the problem.

The real CudaRunner runs in a spawned child as a search drives it, on the CPU: its inputs are built on the
CPU, its reference and the reference's error are slowed past the watchdog, and its kernel is a stand-in that
writes the reference (or hangs). No GPU needed."""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from tuner.backends import gpu_child
from tuner.backends.gpu import GpuBackend
from tuner.backends.gpu_child import CudaRunner
from tuner.backends.phases import KERNEL, SETUP, TIMED, phase_kind
from tuner.problem import Problem
from tuner.profiles import load_profile
from tuner.runtime.fixed_costs import REFERENCE_FLOPS_PER_S, setup_seconds
from tuner.runtime.timed import Timing
from tuner.runtime.verify import Expected, expected_output, make_inputs
from tuner.status import TrialStatus

PROBLEM = Problem(1, 2, 64, 64, 64)
WATCHDOG_S = 0.5
SLOW_S = 1.5  # the reference's build, and its error, each take this long: 3x the watchdog


@dataclass(frozen=True)
class SlowExpected(Expected):
    """A reference whose error takes SLOW_S, as a large problem's does (its output read in fp64)."""

    def error(self, out: Any) -> float:
        time.sleep(SLOW_S)
        return super().error(out)


def slow_reference(*args: Any, **kwargs: Any) -> SlowExpected:
    time.sleep(SLOW_S)  # a long sequence's fp32 reference: seconds
    ref = expected_output(*args, **kwargs)
    return SlowExpected(ref.out, ref.rows, ref.valid)


def cpu_inputs(problem: Problem, _device: str, seed: int) -> Any:
    return make_inputs(problem, "cpu", seed)


def fake_timing(fn: Any, **_kwargs: Any) -> Timing:
    fn()
    return Timing(5.0, 4.9, 5.1, 10)


class SlowSetupRunner(CudaRunner):
    """The real runner (its phases, its inputs' cache, its checks), its CUDA parts replaced in the child."""

    def setup(self) -> None:
        import torch

        torch.cuda.synchronize = lambda *a, **k: None
        gpu_child.make_inputs = cpu_inputs
        gpu_child.expected_output = slow_reference
        gpu_child.time_call = fake_timing

    def facts(self) -> dict[str, Any]:
        return {"gpu_name": "CPU stand-in", "gpu_uuid": None, "driver": None, "cuda_version": None}


class Kernel:
    """A launcher that writes the exact output, or never returns (`hang`: a kernel spinning forever)."""

    registers = 64

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def __call__(self, q: Any, k: Any, v: Any, out: Any, lse: Any, scale: float, seq_lens: Any = None) -> None:
        if self.mode == "hang":
            time.sleep(3600)
        out.copy_(expected_output(PROBLEM, q, k, v, scale).out)

    def launch_unchecked(self, q: Any, k: Any, v: Any, out: Any, lse: Any, scale: float, seq_lens: Any) -> None:
        self(q, k, v, out, lse, scale, seq_lens)


class Built:
    """What a measure request carries (picklable): the kernel's entry names its mode."""

    def __init__(self, mode: str) -> None:
        self.entry, self.compiled = mode, SimpleNamespace(cubin=b"cubin")

    def load(self, device: int, cubin: bytes | None = None) -> Kernel:
        return Kernel(self.entry)


def measure(backend: GpuBackend, mode: str) -> tuple[Any, float]:
    started = time.monotonic()
    m = backend.measure_request({"problem": PROBLEM, "built": Built(mode), "range_prefix": "t"})
    return m, time.monotonic() - started


def backend(setup_timeout_s: float) -> GpuBackend:
    return GpuBackend(load_profile("h100"), watchdog_s=WATCHDOG_S, runner=SlowSetupRunner, timing_budget_s=0.5,
                      start_timeout_s=120, setup_timeout_s=setup_timeout_s)


def test_a_slow_reference_does_not_trip_the_verify_watchdog_and_a_hanging_kernel_still_does() -> None:
    with backend(setup_timeout_s=30.0) as b:
        b.device_facts()  # the child started (its start is not the measurement's)
        ok, _ = measure(b, "ok")
        # The reference's build (prepare) and its error (check) took 3x the watchdog each: set-up, not a hang.
        # Before: the error sat in phase verify (the watchdog's), the build in prepare (watchdog + timing budget).
        assert ok.status is TrialStatus.OK, ok
        assert ok.rel_error is not None and ok.rel_error < 2e-3
        hang, seconds = measure(b, "hang")  # the inputs are built: the next phase is the launch
        assert hang.status is TrialStatus.TIMEOUT and "phase verify" in hang.error, hang
        assert seconds < SLOW_S, seconds  # the watchdog caught it, not a set-up limit
        assert b.restarts == 1


def test_set_up_has_a_limit_of_its_own() -> None:
    with backend(setup_timeout_s=0.3) as b:  # shorter than the reference's build
        b.device_facts()
        m, seconds = measure(b, "ok")
    assert m.status is TrialStatus.TIMEOUT and "phase prepare" in m.error, m
    assert seconds < SLOW_S + 1.0


def test_the_set_up_limit_grows_with_the_reference_s_work() -> None:
    small = setup_seconds(PROBLEM, 300.0)
    assert small == pytest.approx(300.0, abs=0.01)
    qwen = Problem(1, 28, 16384, 16384, 128, heads_kv=4, causal=True)  # a 4.5 s reference on an H200
    flops = 4.0 * 28 * 16384 * 16384 * 128
    assert setup_seconds(qwen, 300.0) == pytest.approx(300.0 + flops / REFERENCE_FLOPS_PER_S)
    assert setup_seconds(qwen, 300.0) - 300.0 > 4.5 * 5  # room for a card several times slower
    sampled = Problem(1, 8, 131072, 131072, 128)  # past FULL_REFERENCE_SCORES: 4 x 256 sampled query rows
    assert setup_seconds(sampled, 0.0) == pytest.approx(4.0 * 8 * 1024 * 131072 * 128 / REFERENCE_FLOPS_PER_S)


def test_phase_kinds_and_the_older_boolean_form() -> None:
    assert (phase_kind(True), phase_kind(False), phase_kind(SETUP)) == (TIMED, KERNEL, SETUP)
    with pytest.raises(ValueError):
        phase_kind("later")
