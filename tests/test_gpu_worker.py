"""The GPU worker's protocol, watchdog and restarts, with fake runners (no GPU needed).

The fakes are module-level classes so that the spawned child can unpickle
them; each one decides what to do from the request's variant name.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from tuner.backends.gpu import GpuBackend
from tuner.backends.gpu_child import RequestError, RunnerOptions
from tuner.errors import NoGpuError, TunerError
from tuner.kernels.compiler import CompileResult
from tuner.kernels.variant import parse_variant_name
from tuner.problem import Problem
from tuner.profiles import load_profile
from tuner.runtime.build import BuiltKernel, launch_shape
from tuner.runtime.timed import Timing
from tuner.status import TrialStatus

PROBLEM = Problem(1, 2, 128, 128, 64)


class FakeRunner:
    """Behaves according to the variant name: ok*, wrong, hang, fault, die, slow_time, missing, cuda_runtime."""

    def __init__(self, options: RunnerOptions) -> None:
        self.options = options
        self.measured = 0

    def setup(self) -> None:
        pass

    def facts(self) -> dict[str, Any]:
        # The uuid tells the options the child was given (a prestarted child gets them on adoption).
        return {"gpu_name": "Fake GPU", "gpu_uuid": f"GPU-fake-{self.options.device}-{self.options.seed}",
                "driver": "1.0", "cuda_version": "13.0"}

    def baselines(self, problem: Problem, range_prefix: str, progress) -> list[dict[str, Any]]:
        progress("sdpa_flash/time", True)
        return [{"impl": "sdpa_flash", "timing": Timing(12.0, 11.0, 13.0, 10)}]

    def measure(self, request: dict[str, Any], progress) -> dict[str, Any]:
        self.measured += 1
        name = request["built"].entry
        progress("prepare", True)
        progress("verify")
        if name == "hang":
            time.sleep(3600)
        if name == "fault":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        if name == "die":
            os._exit(9)  # like a segfault: no reply at all
        if name == "missing":
            raise RequestError("cannot read the cubin of missing")
        if name == "wrong":
            return {"status": "incorrect", "rel_error": 0.5, "error": "relative error 5.0e-01 >= tolerance 0.002"}
        progress("time", True)
        if name == "slow_time":
            time.sleep(1.5)  # longer than the watchdog, within the timing budget
        return {"status": "ok", "timing": Timing(10.0 + self.measured, 9.0, 11.0, 10),
                "rel_error": 1e-4, "l2": self.options.l2_bytes, "range": request["range_prefix"]}

    def close(self) -> None:
        pass


class SlowFactsRunner(FakeRunner):
    def facts(self) -> dict[str, Any]:
        time.sleep(1.5)  # nvidia-smi may take up to its 20 s timeout: longer than the watchdog
        return super().facts()


class NoGpuRunner(FakeRunner):
    def setup(self) -> None:
        raise NoGpuError("no CUDA GPU is visible to torch on this machine")


class BrokenRunner(FakeRunner):
    def setup(self) -> None:
        raise ValueError("cannot initialise")


class RecordingRunner(FakeRunner):
    """Writes the range prefix it was given next to the (fake) cubin, to check what crosses the pipe."""

    def measure(self, request: dict[str, Any], progress) -> dict[str, Any]:
        built, shape = request["built"], request["built"].shape
        Path(built.compiled.cubin_path).with_suffix(".seen").write_text(
            f'{request["range_prefix"]}|{shape.block_m}|{shape.threads}|{shape.smem_bytes}|{shape.tma_swizzle}|'
            f'{len(built.source)}')
        return super().measure(request, progress)


@pytest.fixture
def profile():
    return load_profile("h100")


@pytest.fixture
def backend(profile):
    b = GpuBackend(profile, watchdog_s=1.0, runner=FakeRunner, timing_budget_s=5.0, start_timeout_s=120)
    yield b
    b.close()


def fake_built(name: str, cubin_path: Path | None = Path("/nonexistent"), ok: bool = True) -> BuiltKernel:
    """A BuiltKernel whose entry point is `name` (which tells the fake runners what to do); no nvcc."""
    variant = parse_variant_name("attn_fwd_mma_d64_fp16_m128n64_w4_q_rows_pad_s2_qreg")
    compiled = CompileResult(ok, name, "sm_90a", cubin_path if ok else None, "x" if ok else "", 100, 0, 0, 0, 1.0, "")
    return BuiltKernel(variant, "// source", compiled, launch_shape(variant))


def measure(backend: GpuBackend, name: str, prefix: str = "run1/trial1"):
    return backend.measure_request({"problem": PROBLEM, "built": fake_built(name), "range_prefix": prefix})


def test_default_backend_without_gpu_raises_one_line_no_gpu_error(profile, monkeypatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(NoGpuError) as info:
        GpuBackend(profile)
    assert "\n" not in str(info.value)


def test_needs_compile_and_facts_and_baselines(backend) -> None:
    assert GpuBackend.needs_compile is True
    facts = backend.device_facts()
    assert (facts.gpu_name, facts.gpu_uuid, facts.driver, facts.cuda_version) == ("Fake GPU", "GPU-fake-0-None", "1.0", "13.0")
    [b] = backend.baselines(PROBLEM)
    assert (b.impl, b.median_us, b.p20_us, b.p80_us) == ("sdpa_flash", 12.0, 11.0, 13.0)


def test_ok_and_incorrect_keep_the_same_worker(backend) -> None:
    m = measure(backend, "ok")
    assert m.status is TrialStatus.OK and m.median_us == 11.0 and (m.p20_us, m.p80_us) == (9.0, 11.0)
    pid = backend.worker_pid
    w = measure(backend, "wrong")
    assert w.status is TrialStatus.INCORRECT and w.rel_error == 0.5 and "tolerance" in w.error
    assert measure(backend, "ok").median_us == 13.0  # same child: its counter went on
    assert backend.worker_pid == pid and backend.restarts == 0


def test_fault_is_launch_error_and_the_next_request_gets_a_fresh_worker(backend) -> None:
    measure(backend, "ok")
    first = backend.worker_pid
    m = measure(backend, "fault")
    assert m.status is TrialStatus.LAUNCH_ERROR
    assert "illegal memory access" in m.error and "verify" in m.error
    assert backend.restarts == 1
    again = measure(backend, "ok")
    assert again.status is TrialStatus.OK and again.median_us == 11.0  # a new child counts from 1
    assert backend.worker_pid != first


def test_hang_times_out_kills_the_child_and_the_search_goes_on(backend) -> None:
    measure(backend, "ok")
    hung = backend._worker.process
    start = time.monotonic()
    m = measure(backend, "hang")
    elapsed = time.monotonic() - start
    assert m.status is TrialStatus.TIMEOUT and "verify" in m.error and "killed" in m.error
    assert elapsed < 10, elapsed  # the watchdog (1 s) fired, not the 1 h sleep
    assert not hung.is_alive() and hung.exitcode == -9  # SIGKILL
    assert measure(backend, "ok").status is TrialStatus.OK
    assert backend.restarts == 1


def test_long_phases_get_the_timing_budget(backend) -> None:
    m = measure(backend, "slow_time")
    assert m.status is TrialStatus.OK and backend.restarts == 0


def test_reading_the_gpus_facts_gets_the_timing_budget(profile) -> None:
    with GpuBackend(profile, watchdog_s=1.0, runner=SlowFactsRunner, timing_budget_s=5.0, start_timeout_s=120) as b:
        assert b.device_facts().gpu_name == "Fake GPU" and b.restarts == 0


def test_the_search_seed_reaches_the_gpu_worker(profile, monkeypatch) -> None:
    """--seed makes the worker's random inputs reproducible: make_backend hands it to the GPU backend."""
    import tuner.search.hooks as hooks

    made = []
    monkeypatch.setattr(hooks, "GpuBackend", lambda **kwargs: made.append(kwargs) or kwargs)
    hooks.make_backend("gpu", 1, profile, seed=7)
    assert made == [dict(device=1, profile=profile, objective="time", seed=7)]


def test_child_that_dies_without_a_reply_is_a_launch_error(backend) -> None:
    m = measure(backend, "die")
    assert m.status is TrialStatus.LAUNCH_ERROR and "exit code 9" in m.error
    assert measure(backend, "ok").status is TrialStatus.OK


def test_refused_request_is_a_failed_trial_and_keeps_the_worker(backend) -> None:
    measure(backend, "ok")
    pid = backend.worker_pid
    m = measure(backend, "missing")  # the search stores it and goes on
    assert m.status is TrialStatus.LAUNCH_ERROR and "cannot read the cubin" in m.error
    assert backend.worker_pid == pid and backend.restarts == 0


def test_faults_in_a_row_each_restart(backend) -> None:
    statuses = [measure(backend, name).status for name in ("fault", "hang", "fault", "ok", "wrong", "ok")]
    assert statuses == [TrialStatus.LAUNCH_ERROR, TrialStatus.TIMEOUT, TrialStatus.LAUNCH_ERROR,
                        TrialStatus.OK, TrialStatus.INCORRECT, TrialStatus.OK]
    assert backend.restarts == 3


def test_no_gpu_in_the_child_is_a_no_gpu_error(profile) -> None:
    with GpuBackend(profile, runner=NoGpuRunner, start_timeout_s=120) as b:
        with pytest.raises(NoGpuError, match="no CUDA GPU"):
            b.device_facts()


def test_a_runner_that_cannot_start_is_a_tuner_error(profile) -> None:
    with GpuBackend(profile, runner=BrokenRunner, start_timeout_s=120) as b:
        with pytest.raises(TunerError, match="cannot initialise"):
            measure(b, "ok")


def test_close_stops_the_child_and_refuses_more_work(profile) -> None:
    b = GpuBackend(profile, runner=FakeRunner, start_timeout_s=120)
    measure(b, "ok")
    process = b._worker.process
    b.close()
    assert not process.is_alive() and process.exitcode == 0  # stopped cleanly, not killed
    with pytest.raises(TunerError, match="closed"):
        measure(b, "ok")


def test_measure_sends_the_built_kernel_and_range_prefix(profile, tmp_path) -> None:
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(b"\0")
    built = fake_built("ok", cubin)
    from tuner.kernels.feasibility import resources

    res = resources(built.variant)
    with GpuBackend(profile, runner=RecordingRunner, start_timeout_s=120, range_prefix="run7/trial3") as b:
        assert b.measure(PROBLEM, built.variant, built).status is TrialStatus.OK
        # The launch shape crosses the pipe; the source does not (the child reads the cubin).
        assert cubin.with_suffix(".seen").read_text() == f"run7/trial3|128|128|{res['smem_bytes']}|0|0"
        b.measure(PROBLEM, built.variant, built, range_prefix="run7/trial4")
        assert cubin.with_suffix(".seen").read_text().startswith("run7/trial4|")
        with pytest.raises(TunerError, match="no cubin"):
            b.measure(PROBLEM, built.variant, fake_built("ok", ok=False))



def test_a_submitted_measurement_returns_at_once_and_the_next_request_collects_it_first(backend) -> None:
    """The search sends a trial and asks the sampler while the card works: submit_measure must not wait,
    and a request made before result() must not read the submitted trial's reply as its own."""
    backend.device_facts()  # the worker is up
    variant = parse_variant_name("attn_fwd_mma_d64_fp16_m128n64_w4_q_rows_pad_s2_qreg")
    started = time.perf_counter()
    first = backend.submit_measure(PROBLEM, variant, fake_built("slow_time"), range_prefix="run1/trial1")
    assert time.perf_counter() - started < 1.0  # the child sleeps 1.5 s in it
    second = backend.submit_measure(PROBLEM, variant, fake_built("ok"), range_prefix="run1/trial2")
    [baseline] = backend.baselines(PROBLEM)  # a third request while the second is in flight
    assert baseline.impl == "sdpa_flash"
    a, b = first.result(), second.result()
    assert (a.status, a.median_us) == (TrialStatus.OK, 11.0) and (b.status, b.median_us) == (TrialStatus.OK, 12.0)
    assert first.seconds >= 1.5 and first.result() is a  # collected once, then cached
    assert measure(backend, "ok").median_us == 13.0  # the pipe is still in step


def test_a_prestarted_child_is_adopted_by_the_backend_of_its_device(profile, monkeypatch) -> None:
    """`tuner search` starts the GPU child before it prepares its studies (its torch import then overlaps
    them): the backend built afterwards for that device uses that very child, another device starts its
    own, a dead prestarted child is replaced, and one nobody adopted is stopped by discard_prestarted."""
    from tuner.backends import gpu_process

    monkeypatch.setattr(gpu_process, "_prestarted", {})
    gpu_process.prestart(0, runner=FakeRunner)
    gpu_process.prestart(0, runner=FakeRunner)  # a second call for the same device starts nothing more
    assert len(gpu_process._prestarted) == 1
    pid = next(iter(gpu_process._prestarted.values())).pid
    with GpuBackend(profile, device=0, seed=5, runner=FakeRunner, start_timeout_s=120) as mine, \
            GpuBackend(profile, device=1, runner=FakeRunner, start_timeout_s=120) as other:
        assert mine.device_facts().gpu_uuid == "GPU-fake-0-5"  # started before its options, given them since
        assert other.device_facts().gpu_uuid == "GPU-fake-1-None"
        assert mine.worker_pid == pid and other.worker_pid != pid
        assert gpu_process._prestarted == {}

    gpu_process.prestart(2, runner=FakeRunner)
    dead = next(iter(gpu_process._prestarted.values()))
    dead.process.kill()
    dead.process.join(30)
    with GpuBackend(profile, device=2, runner=FakeRunner, start_timeout_s=120) as backend:
        assert backend.device_facts().gpu_name == "Fake GPU" and backend.worker_pid != dead.pid

    gpu_process.prestart(3, runner=FakeRunner)
    unused = next(iter(gpu_process._prestarted.values()))
    gpu_process.discard_prestarted(3, runner=FakeRunner)
    assert gpu_process._prestarted == {} and not unused.process.is_alive()
