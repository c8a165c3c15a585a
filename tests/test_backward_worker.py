"""The GPU worker's runner on a backward problem, run on a CPU with a stand-in kernel and timing: the variant is
loaded as a backward kernel, fed the problem's dO, O and lse, its dQ, dK and dV checked against the fp32 reference
before it is timed (a wrong gradient is named), and the baselines asked for are the backward's."""

from __future__ import annotations

from typing import Any

import pytest

from tuner.backends import gpu_child
from tuner.backends.gpu_child import CudaRunner, RunnerOptions
from tuner.problem import Problem
from tuner.runtime.backward_trial import backward_inputs
from tuner.runtime.timed import Timing
from tuner.runtime.verify import make_inputs

torch = pytest.importorskip("torch")

PROBLEM = Problem(1, 4, 48, 48, 32, causal=True, heads_kv=2, kernel_pass="backward")
TIMING = Timing(10.0, 9.5, 10.5, 200)


class FakeBackward:
    """Writes the reference gradients (times `skew` for dk) into the gradients it is given."""

    registers = 128

    def __init__(self, reference: Any, skew: float) -> None:
        self.reference, self.skew, self.calls = reference, skew, []

    def __call__(self, q, k, v, o, lse, do, scale, grads):
        self.calls.append(("checked", o is not None and lse is not None and do is not None))
        for out, ref, factor in zip(grads, self.reference.grads, (1.0, self.skew, 1.0)):
            out.copy_(ref * factor)

    def launcher(self, *args, grads):
        self.calls.append(("prepared", True))
        return lambda: None


class FakeBuilt:
    entry = "attn_bwd_mma_fake"
    compiled = type("Compiled", (), {"cubin": b"cubin"})()


@pytest.fixture
def runner(monkeypatch) -> Any:
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(gpu_child, "time_call", lambda fn, **kwargs: TIMING)
    q, k, v = (t.float() for t in make_inputs(PROBLEM, "cpu", seed=2))
    data = {"q": q, "k": k, "v": v, "scale": 0.2, "seed": 2, **backward_inputs(PROBLEM, q, k, v, 0.2, seed=2)}
    runner = CudaRunner(RunnerOptions())
    monkeypatch.setattr(runner, "_problem_inputs", lambda problem: data)
    monkeypatch.setattr(runner, "_intact", lambda problem, data: True)
    asked = []
    monkeypatch.setattr(gpu_child, "available_baselines", lambda *a, **k: asked.append("forward") or [])
    monkeypatch.setattr(gpu_child, "backward_baselines", lambda problem, data: asked.append("backward") or [])
    runner.asked, runner.data = asked, data
    return runner


def _measure(runner: Any, monkeypatch, skew: float) -> tuple[dict[str, Any], FakeBackward]:
    kernel = FakeBackward(runner.data["ref"], skew)
    loaded = []
    monkeypatch.setattr(gpu_child, "load_kernel",
                        lambda built, problem, device, cubin=None: loaded.append(problem.kernel_pass) or kernel)
    reply = runner.measure({"problem": PROBLEM, "built": FakeBuilt()}, lambda *a, **k: None)
    assert loaded == ["backward"]
    return reply, kernel


def test_a_correct_backward_is_verified_then_timed(runner, monkeypatch) -> None:
    reply, kernel = _measure(runner, monkeypatch, skew=1.0)
    assert reply["status"] == "ok" and reply["timing"] == TIMING and reply["registers"] == 128
    assert reply["rel_error"] == pytest.approx(0.0, abs=1e-6)
    assert kernel.calls == [("checked", True), ("prepared", True)]  # the verify launch, then the timed launcher


def test_a_wrong_gradient_is_incorrect_and_named(runner, monkeypatch) -> None:
    reply, kernel = _measure(runner, monkeypatch, skew=1.05)
    assert reply["status"] == "incorrect" and reply["rel_error"] == pytest.approx(0.05, rel=1e-3)
    assert "dk 5.0e-02" in reply["error"] and "dq 0.0e+00" in reply["error"]
    assert kernel.calls == [("checked", True)]  # never timed


def test_the_baselines_of_a_backward_are_the_backwards(runner) -> None:
    assert runner.baselines(PROBLEM, "r", lambda *a, **k: None) == []
    assert runner.asked == ["backward"]


def test_the_confirm_stage_times_only_backwards_verified_again(runner, monkeypatch) -> None:
    kernels = {"good": FakeBackward(runner.data["ref"], 1.0), "bad": FakeBackward(runner.data["ref"], 1.05)}
    monkeypatch.setattr(gpu_child, "load_kernel", lambda built, problem, device, cubin=None: kernels[built.entry])
    builts = [type("Built", (), {"entry": name})() for name in kernels]
    timed = runner.confirm({"problem": PROBLEM, "builts": builts, "rounds": 2, "baselines": None},
                           lambda *a, **k: None)
    assert set(timed) == {"good"} and len(timed["good"]) == 2
    assert runner.asked == ["backward"]
