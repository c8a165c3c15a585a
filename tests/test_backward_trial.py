"""A backward trial's inputs and reference (tuner.runtime.backward_trial), on the CPU in float32-exact checks: the
reference made one (batch row, K/V head) at a time is the whole problem's fp32 autograd, and its error names the
worst gradient."""

from __future__ import annotations

import math

import pytest

from tuner.problem import Problem
from tuner.runtime.backward_trial import backward_call, backward_inputs, poisoned_grads
from tuner.runtime.backward_verify import problem_grads, problem_noise_floors, reference_forward
from tuner.runtime.verify import make_inputs

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("problem", [
    Problem(2, 4, 33, 47, 32, causal=True, heads_kv=2, kernel_pass="backward"),
    Problem(1, 2, 40, 40, 32, window_left=5, softcap=10.0, kernel_pass="backward"),
])
def test_the_chunked_reference_is_the_whole_problems(problem: Problem) -> None:
    q, k, v = (t.float() for t in make_inputs(problem, "cpu", seed=3))
    scale = 1 / math.sqrt(problem.head_dim)
    data = backward_inputs(problem, q, k, v, scale, seed=3)
    do = data["do"]
    want = problem_grads(problem, q, k, v, do, scale)
    for got, ref in zip(data["ref"].grads, want):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    floors = problem_noise_floors(problem, q, k, v, do, scale)
    assert data["ref"].floors == pytest.approx(floors, rel=1e-4)
    out, lse = reference_forward(q, k, v, problem.causal, scale, (problem.window_left, problem.window_right),
                                 problem.softcap)
    torch.testing.assert_close(data["o"], out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(data["lse"], lse, rtol=1e-5, atol=1e-6)
    assert data["ref"].error(want) < 1e-5


def test_a_wrong_or_unwritten_gradient_is_an_error() -> None:
    problem = Problem(1, 2, 16, 16, 32, kernel_pass="backward")
    q, k, v = (t.float() for t in make_inputs(problem, "cpu", seed=1))
    data = {"q": q, "k": k, "v": v, "scale": 0.2, **backward_inputs(problem, q, k, v, 0.2, seed=1)}
    good = tuple(g.clone() for g in data["ref"].grads)
    assert data["ref"].error(good) == 0.0
    errors = data["ref"].errors((good[0], good[1] * 1.1, good[2]))
    assert errors["dq"] == 0.0 and errors["dk"] == pytest.approx(0.1) and errors["dv"] == 0.0
    assert data["ref"].describe((good[0], good[1] * 1.1, good[2])) == "dq 0.0e+00, dk 1.0e-01, dv 0.0e+00"
    poisoned = poisoned_grads(data)
    assert [p.shape for p in poisoned] == [q.shape, k.shape, v.shape]
    assert data["ref"].error(poisoned) == math.inf


def test_a_backward_call_is_checked_each_time_or_prepared_once() -> None:
    class Kernel:
        def __init__(self) -> None:
            self.seen: list = []

        def __call__(self, *args, grads):
            self.seen.append(("checked", args, grads))

        def launcher(self, *args, grads):
            self.seen.append(("prepared", args, grads))
            return lambda: self.seen.append("launch")

    data = {name: name for name in ("q", "k", "v", "o", "lse", "do")} | {"scale": 0.5}
    args, grads = ("q", "k", "v", "o", "lse", "do", 0.5), ("dq", "dk", "dv")
    kernel = Kernel()
    checked = backward_call(kernel, data, grads, checked=True)
    checked(), checked()
    assert kernel.seen == [("checked", args, grads)] * 2
    kernel = Kernel()
    bare = backward_call(kernel, data, grads, checked=False)
    bare(), bare()
    assert kernel.seen == [("prepared", args, grads), "launch", "launch"]
