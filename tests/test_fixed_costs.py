"""Fixed costs off the critical path (issue 38, item 2), without a GPU: the first trials compile while the
baselines are timed; FlashAttention-4's import runs on a thread from the GPU worker's start; a problem's inputs
and reference are built once and kept while intact; the time breakdown names the worker's fixed costs."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from fa4_fakes import unset_fa4_cache_settings

import tuner.backends.gpu_child as gpu_child
import tuner.runtime.baselines as baselines
import tuner.runtime.fixed_costs as fixed_costs
from tuner.backends.gpu import RESTART, GpuBackend
from tuner.backends.gpu_child import CudaRunner, RunnerOptions
from tuner.backends.replay import ReplayBackend
from tuner.kernels.compiler import CompileResult
from tuner.kernels.variant import parse_variant_name
from tuner.problem import Problem
from tuner.profiles import load_profile
from tuner.runtime.build import BuiltKernel, launch_shape
from tuner.runtime.fixed_costs import BASELINE_SETUP, INPUTS, REFERENCE, VERIFICATION, Spent, fingerprint
from tuner.runtime.verify import expected_output, make_inputs
from tuner.search.hooks import Hooks
from tuner.search.job import MEASURING, WorkerResult
from tuner.search.options import SearchOptions
from tuner.search.run import SearchReport, run_search

SMALL = Problem(1, 2, 64, 64, 64)


def built_of(variant, name: str = "") -> BuiltKernel:
    """A BuiltKernel around a made-up compile result (no nvcc); `name` is its entry point."""
    compiled = CompileResult(True, name or variant.name, "sm_90a", Path("/nonexistent"), "ab" * 32, 96, 0, 0, 0,
                             0.5, "ptxas info", False)
    return BuiltKernel(variant, "", compiled, launch_shape(variant))


def replay_options(rec, db_url: str, **changes) -> SearchOptions:
    p = rec.problem
    return SearchOptions(gpu=rec.profile, shapes=(f"{p.batch},{p.heads},{p.seq_q},{p.seq_k},{p.head_dim}",),
                         dtype=p.dtype, causal=p.causal, backend="replay", replay_from=rec.url, db_url=db_url,
                         seed=5, **changes)


# --- the first trials compile while the baselines are timed ------------------------------------


class CompilingReplay(ReplayBackend):
    """The replay backend as a GPU worker is driven: its variants are compiled first."""

    needs_compile = True

    def __init__(self, rec, compiling: threading.Event) -> None:
        super().__init__(rec.url, load_profile(rec.profile))
        self.compiling = compiling
        self.compiled_meanwhile = None

    def baselines(self, problem):
        self.compiled_meanwhile = self.compiling.wait(10)  # a compile under way while the baselines are timed
        return super().baselines(problem)


def test_the_first_trials_compile_while_the_baselines_are_timed(replay_recording, sqlite_url) -> None:
    compiling, timing_baselines = threading.Event(), threading.Event()
    backend = CompilingReplay(replay_recording, compiling)
    original = backend.baselines

    def baselines(problem):
        timing_baselines.set()
        return original(problem)

    backend.baselines = baselines

    def build(variant, arch):
        compiling.set()
        assert timing_baselines.wait(10), "the baselines were not timed while this compiled"
        return built_of(variant)

    report = run_search(replay_options(replay_recording, sqlite_url, trials=6, confirm=0),
                        hooks=Hooks(make_backend=lambda *a, **k: backend, build=build))
    assert backend.compiled_meanwhile is True
    assert report.asked == 6 and report.measured > 0


# --- FlashAttention-4's import on a thread --------------------------------------------------------


@pytest.fixture
def slow_fa4(tmp_path, monkeypatch) -> threading.Event:
    """A stand-in `flash_attn.cute` whose import waits for the returned event (FA4's import takes seconds), and
    notes the thread it ran on; no import thread started yet in this process."""
    (tmp_path / "fa4_gate.py").write_text("import threading\nrelease = threading.Event()\n")
    package = tmp_path / "flash_attn"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "cute.py").write_text(
        "import threading\nimport fa4_gate\nassert fa4_gate.release.wait(30)\n"
        "IMPORTED_ON = threading.current_thread().name\n\n"
        "def flash_attn_func(q, k, v, **kwargs):\n    return q\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("fa4_gate", "flash_attn", "flash_attn.cute"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    unset_fa4_cache_settings(monkeypatch)
    monkeypatch.setattr(fixed_costs, "_imports", {})
    monkeypatch.setattr(gpu_child, "cuda_driver", lambda device=0: None)  # no GPU here

    def no_sdpa(*_args, **_kwargs):
        raise RuntimeError("no SDPA backend on a CPU test")

    monkeypatch.setattr(baselines, "sdpa_baseline", no_sdpa)
    import fa4_gate

    yield fa4_gate.release
    fa4_gate.release.set()  # never leave the thread waiting
    fixed_costs.await_baseline_imports()


@pytest.mark.parametrize("start", ["setup", "warm_up"])
def test_fa4_is_imported_on_a_thread_from_the_worker_s_start(slow_fa4, start) -> None:
    runner = CudaRunner(RunnerOptions())
    if start == "setup":
        runner.setup()
    else:  # a child started before its options are known (prestart) begins there
        gpu_child.warm_up(gpu_child.default_runner, 0)
    # Returned while the import still waits: it is not on the start's path.
    assert not hasattr(sys.modules.get("flash_attn.cute"), "IMPORTED_ON")
    slow_fa4.set()
    q, k, v = make_inputs(SMALL, "cpu", seed=1)
    found = runner._available_baselines(SMALL, {"q": q, "k": k, "v": v, "scale": 0.125, "seed": 1})
    assert "fa4" in [b.name for b in found]  # the first baselines' request waited for the import, then used it
    assert sys.modules["flash_attn.cute"].IMPORTED_ON == "tuner-baseline-imports"
    assert BASELINE_SETUP in runner.spent.take()


# --- a problem's inputs and reference: built once, kept while intact --------------------------------


@pytest.fixture
def cpu_runner(monkeypatch) -> tuple[CudaRunner, list[str]]:
    """A CudaRunner making its inputs on the CPU, and the list of what it built ("inputs", "reference")."""
    built: list[str] = []

    def inputs(problem, _device, seed):
        built.append(INPUTS)
        return make_inputs(problem, "cpu", seed)

    def reference(*args, **kwargs):
        built.append(REFERENCE)
        return expected_output(*args, **kwargs)

    monkeypatch.setattr(gpu_child, "make_inputs", inputs)
    monkeypatch.setattr(gpu_child, "expected_output", reference)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    return CudaRunner(RunnerOptions(seed=3)), built


def test_a_problem_s_inputs_and_reference_are_built_once_for_all_its_trials(cpu_runner) -> None:
    runner, built = cpu_runner
    first = runner._problem_inputs(SMALL)
    assert all(runner._problem_inputs(SMALL) is first for _ in range(60))  # a search's trials, its confirm stage
    assert built == [INPUTS, REFERENCE]
    assert set(runner.spent.take()) == {INPUTS, REFERENCE}  # named in the time breakdown


class Kernel:
    """A launcher whose output is the reference; `spill` also writes into q, past its output."""

    registers = 64

    def __init__(self, spill: bool = False, wrong: bool = False) -> None:
        self.spill, self.wrong = spill, wrong

    def __call__(self, q, k, v, out, lse, scale, seq_lens=None):
        out.copy_(expected_output(SMALL, q, k, v, scale).out)
        if self.wrong:
            out.mul_(2)
        if self.spill:
            q.view(-1)[:8] += 1


class Built:
    """What a measure request carries, for a Kernel."""

    def __init__(self, kernel: Kernel) -> None:
        self.entry, self.kernel = "k", kernel
        self.compiled = type("Compiled", (), {"cubin": b""})()

    def load(self, device, cubin=None) -> Kernel:
        return self.kernel


def measure(runner: CudaRunner, kernel: Kernel) -> dict:
    return runner.measure({"problem": SMALL, "built": Built(kernel)}, lambda *a, **k: None)


def test_a_wrong_kernel_costs_no_new_inputs_but_one_that_wrote_into_them_is_wrong_and_they_are_rebuilt(
        cpu_runner) -> None:
    runner, built = cpu_runner
    wrong = measure(runner, Kernel(wrong=True))
    assert wrong["status"] == "incorrect" and "relative error" in wrong["error"]
    assert built == [INPUTS, REFERENCE]  # a wrong output alone leaves the inputs as they were: kept
    spilled = measure(runner, Kernel(spill=True))  # its own output is right
    assert spilled["status"] == "incorrect" and "wrote past its output" in spilled["error"]
    entry = runner._problem_inputs(SMALL)  # the next variant gets fresh ones
    assert built == [INPUTS, REFERENCE] * 2 and entry["seed"] != spilled["seed"]
    assert VERIFICATION in runner.spent.take()


def test_a_fingerprint_changes_with_any_byte_of_the_tensors_it_covers() -> None:
    q, k, v = make_inputs(SMALL, "cpu", seed=2)
    entry = {"q": q, "k": k, "ref": expected_output(SMALL, q, k, v, 0.125), "packed": {"v": v, "lengths": [64]}}
    before = fingerprint(entry)
    assert fingerprint(entry) == before
    v.view(-1).view(torch.uint8)[100] ^= 1  # one bit of a nested tensor
    assert fingerprint(entry) != before
    v.view(-1).view(torch.uint8)[100] ^= 1
    entry["ref"].out[0, 0, 0, 0] += 1.0  # the reference, inside its dataclass
    assert fingerprint(entry) != before


# --- the time breakdown names the fixed costs ------------------------------------------------------


class SpendingRunner:
    """A fake GPU worker runner (module level: the spawned child unpickles it) that reports its fixed costs
    as the real one does; a variant named `fault` kills its CUDA context."""

    def __init__(self, options: RunnerOptions) -> None:
        self.spent = Spent()

    def setup(self) -> None:
        pass

    def facts(self) -> dict:
        return {"gpu_name": "Fake GPU", "gpu_uuid": "GPU-fake", "driver": "1.0", "cuda_version": "13.0"}

    def baselines(self, problem, range_prefix, progress) -> list:
        with self.spent.part(INPUTS):
            time.sleep(0.05)
        return []

    def measure(self, request, progress) -> dict:
        if request["built"].entry == "fault":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        with self.spent.part(VERIFICATION):
            time.sleep(0.02)
        return {"status": "incorrect", "rel_error": 0.5, "error": "wrong"}

    def close(self) -> None:
        pass


def test_the_gpu_worker_s_fixed_costs_are_told_by_request_and_its_restarts_apart() -> None:
    variant = parse_variant_name("attn_fwd_mma_d64_fp16_m128n64_w4_q_rows_pad_s2_qreg")
    with GpuBackend(load_profile("h100"), watchdog_s=5.0, runner=SpendingRunner, start_timeout_s=120) as backend:
        backend.baselines(SMALL)
        backend.measure(SMALL, variant, built_of(variant, "ok"))
        assert backend.measure(SMALL, variant, built_of(variant, "fault")).status.value == "launch_error"
        backend.measure(SMALL, variant, built_of(variant, "ok"))  # on a fresh child
        costs = backend.fixed_costs()
    assert set(costs) == {("baselines", INPUTS), ("measure", VERIFICATION), (None, RESTART)}
    assert costs[("baselines", INPUTS)] >= 0.05 and costs[("measure", VERIFICATION)] >= 0.04
    assert costs[(None, RESTART)] > 0


def test_fixed_costs_come_out_of_the_phase_that_waited_for_them() -> None:
    result = WorkerResult(seconds={"baselines": 3.0, MEASURING: 5.0, "confirm stage": 2.0})
    result.spent_within({("baselines", BASELINE_SETUP): 2.0, ("baselines", INPUTS): 0.5, ("measure", VERIFICATION):
                         1.0, ("confirm", VERIFICATION): 0.5, (None, RESTART): 4.0, ("measure", REFERENCE): 9.0})
    assert result.seconds == pytest.approx({"baselines": 0.5, MEASURING: 0.0, "confirm stage": 1.5,
                                            BASELINE_SETUP: 2.0, INPUTS: 0.5, VERIFICATION: 1.5, RESTART: 4.0,
                                            REFERENCE: 4.0})  # never more than the phase that waited for it


class CostlyReplay(ReplayBackend):
    """The replay backend telling fixed costs as the GPU backend does: 0.2 s of its baselines were inputs."""

    def baselines(self, problem):
        time.sleep(0.3)
        return super().baselines(problem)

    def fixed_costs(self) -> dict:
        return {("baselines", INPUTS): 0.2, (None, RESTART): 0.01}


def test_a_search_s_time_breakdown_names_the_fixed_costs_and_its_own_phases(replay_recording, sqlite_url) -> None:
    rec = replay_recording
    backend = CostlyReplay(rec.url, load_profile(rec.profile))
    report = run_search(replay_options(rec, sqlite_url, trials=5, confirm=0),
                        hooks=Hooks(make_backend=lambda *a, **k: backend))
    seconds = dict(report.seconds)
    assert seconds[INPUTS] == pytest.approx(0.2) and seconds[RESTART] == pytest.approx(0.01)
    assert 0.1 - 0.02 <= seconds["baselines"] < 0.2  # what is left of the 0.3 s
    assert "stopping the GPU worker" in seconds
    assert [phase for phase, _ in report.search_seconds] == ["preparing the search", "summing up"]
    assert sum(seconds.values()) + sum(s for _, s in report.search_seconds) <= report.wall_s


def test_the_time_line_puts_the_search_s_own_phases_first_and_undivided() -> None:
    from tuner.cli.search_commands import time_line

    report = SearchReport(summaries=[], run_ids=[1, 2], studies=["s"], interrupted=False, measured=1, reused=0,
                          asked=1, seconds=(("start-up", 4.0), (INPUTS, 2.0)), wall_s=10.0, workers=2,
                          search_seconds=(("preparing the search", 1.0), ("summing up", 1.0)))
    assert time_line(report) == ("time: 10.0 s wall; preparing the search 1.0 s (10%), summing up 1.0 s (10%), "
                                 "2 workers, per worker (mean): start-up 2.0 s (20%), inputs 1.0 s (10%), "
                                 "other 5.0 s (50%)")


def test_per_inputs_makes_a_value_once_for_each_problems_inputs_and_keeps_the_latest_two() -> None:
    from tuner.runtime.fixed_costs import PerInputs

    made: list[tuple] = []
    kept = PerInputs(keep=2)

    def get(problem: Problem, seed: int) -> tuple:
        return kept.get(problem, {"seed": seed}, lambda: made.append((problem.seq_q, seed)) or (problem.seq_q, seed))

    a, b, c = (Problem(1, 2, s, s, 64) for s in (128, 256, 512))
    assert [get(a, 1), get(a, 1), get(b, 1), get(a, 2)] == [(128, 1), (128, 1), (256, 1), (128, 2)]
    assert made == [(128, 1), (256, 1), (128, 2)]
    get(c, 1)  # a third inputs: the oldest kept (b's) goes
    get(b, 1)
    assert made[-2:] == [(512, 1), (256, 1)]
