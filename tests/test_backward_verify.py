"""The backward check's error metric (tuner.runtime.backward_verify.grad_error with grad_noise_floors), on the CPU:
at Sk = 1 the exact dQ and dK are zero and fp32 autograd's are rounding noise, so a kernel's rounding-size answer
passes (it failed plain relative error on the H200, session 20: 4 of 46 checks) while a real error still fails;
with more keys the metric is the relative L2 error it was."""

from __future__ import annotations

import math

import pytest
import torch

from tuner.problem import Problem
from tuner.runtime.backward_verify import (GRAD_TOLERANCE, grad_error, problem_grads, problem_noise_floors,
                                           reference_forward)
from tuner.runtime.verify import keys_kept, make_inputs, relative_error

NAMES = ("dq", "dk", "dv")


def _case(problem: Problem, seed: int = 0):
    q, k, v = make_inputs(problem, device="cpu", seed=seed)
    do = torch.randn(q.shape, dtype=q.dtype, generator=torch.Generator().manual_seed(seed + 1))
    scale = 1.0 / math.sqrt(problem.head_dim)
    return q, k, v, do, scale, problem_grads(problem, q, k, v, do, scale), problem_noise_floors(problem, q, k, v, do,
                                                                                               scale)


def _kernel_like_grads(problem: Problem, q, k, v, do, scale):
    """What a 16-bit backward kernel returns: FlashAttention's backward from O (rounded to the dtype) and lse, P and
    dS rounded to the dtype before their products, the gradients written in the dtype."""
    group = problem.heads // problem.heads_kv
    o, lse = reference_forward(q.float(), k.float(), v.float(), problem.causal, scale)
    o = o.to(q.dtype).float()
    ke, ve = (t.float().repeat_interleave(group, 1) for t in (k, v))
    s = q.float() @ ke.transpose(-1, -2) * scale
    s = s.masked_fill(~keys_kept(problem.seq_q, problem.seq_k, problem.seq_k, problem.causal, "cpu"), float("-inf"))
    p = torch.exp(s - torch.where(torch.isinf(lse), float("inf"), lse)[..., None])  # rows without keys: P = 0
    ds = p * (do.float() @ ve.transpose(-1, -2) - (do.float() * o).sum(-1, keepdim=True))
    p16, ds16 = p.to(q.dtype).float(), ds.to(q.dtype).float()
    dq = scale * ds16 @ ke
    dk = (scale * ds16.transpose(-1, -2) @ q.float()).unflatten(1, (problem.heads_kv, group)).sum(2)
    dv = (p16.transpose(-1, -2) @ do.float()).unflatten(1, (problem.heads_kv, group)).sum(2)
    return tuple(t.to(q.dtype) for t in (dq, dk, dv))


@pytest.mark.parametrize("problem", [Problem(1, 2, 1, 1, 64), Problem(1, 2, 1, 1, 128, dtype="bf16", causal=True)],
                         ids=["fp16", "bf16_causal"])
def test_one_key_exact_zero_against_rounding_noise_passes(problem) -> None:
    q, k, v, do, scale, ref, floors = _case(problem)
    tol = GRAD_TOLERANCE[problem.dtype]
    got = _kernel_like_grads(problem, q, k, v, do, scale)
    for name, g, r in zip(NAMES, got, ref):
        assert grad_error(g, r, floors[name]) < tol / 10, name
    # dQ and dK: exactly zero, the reference rounding noise (plain relative error fails them); dV a real gradient.
    for name in ("dq", "dk"):
        i = NAMES.index(name)
        assert grad_error(torch.zeros_like(got[i]), ref[i], floors[name]) < tol / 10, name  # the exact answer
        # fp32 autograd's rounding noise there (the H200's was ~1e-7 of the inputs' scale; a CPU's may be exact 0)
        noise = 1e-7 * torch.randn(ref[i].shape, generator=torch.Generator().manual_seed(i))
        assert relative_error(torch.zeros_like(got[i]), noise) == 1.0 > tol  # plain relative error: FAIL
        assert grad_error(torch.zeros_like(got[i]), noise, floors[name]) < tol, name
        assert torch.linalg.vector_norm(ref[i]).item() < floors[name]
    assert torch.linalg.vector_norm(ref[2]).item() > floors["dv"]


def test_one_key_real_errors_still_fail() -> None:
    problem = Problem(1, 2, 1, 1, 64)
    q, k, v, do, scale, ref, floors = _case(problem)
    tol = GRAD_TOLERANCE[problem.dtype]
    # dQ of a gradient's size where the exact one is zero: k's own magnitude, scaled like a gradient
    wrong_dq = (scale * k.float() * do.float().abs().mean()).to(q.dtype)
    assert grad_error(wrong_dq, ref[0], floors["dq"]) > 100 * tol
    assert grad_error(torch.zeros_like(ref[2]), ref[2], floors["dv"]) == pytest.approx(1.0)  # dV unwritten (zero)
    assert grad_error((ref[2] * 1.1).to(q.dtype), ref[2], floors["dv"]) > tol
    assert grad_error(torch.full_like(ref[0], float("nan")), ref[0], floors["dq"]) == float("inf")


@pytest.mark.parametrize("problem", [
    Problem(1, 2, 17, 17, 64, causal=True),
    Problem(1, 2, 130, 130, 64, dtype="bf16", causal=True),
    Problem(2, 8, 257, 257, 64, heads_kv=2),
    Problem(1, 8, 300, 17, 64, dtype="bf16", heads_kv=2),
    Problem(1, 2, 300, 100, 128, dtype="bf16", causal=True),   # rows that see no key
    Problem(1, 4, 200, 200, 64, dtype="bf16", softcap=5.0, heads_kv=2),
    Problem(1, 2, 250, 400, 64, window_left=70, window_right=10),
], ids=lambda p: p.label.replace(" ", "_"))
def test_with_more_keys_it_is_the_relative_error(problem) -> None:
    q, k, v, do, scale, ref, floors = _case(problem)
    tol = GRAD_TOLERANCE[problem.dtype]
    got = _kernel_like_grads(problem, q, k, v, do, scale) if problem.window_left < 0 and not problem.softcap \
        else tuple(r.to(q.dtype) for r in ref)
    for name, g, r in zip(NAMES, got, ref):
        assert floors[name] < 0.5 * torch.linalg.vector_norm(r).item(), name  # the floor does not bind
        assert grad_error(g, r, floors[name]) == relative_error(g, r) < tol, name
        assert grad_error(r * 1.05, r, floors[name]) == pytest.approx(0.05, rel=1e-6), name
