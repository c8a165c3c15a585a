"""Correctness of attention backward kernels: the fp32 reference of dQ, dK and dV (torch autograd through fp32
attention math with the kernels' masks: bottom-right aligned causality, sliding window, softcap; rows that see no
key give 0), and one problem's check of backward variants fed by our sm_80 forward's output and lse.

The check's error is relative L2 with an absolute floor (grad_error, grad_noise_floors): a gradient whose exact value
is zero or cancels to the rounding level (dQ and dK at Sk = 1: the softmax over one key has no gradient) compares
against the size its rounding error can have, not against the reference's own rounding noise."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from tuner.kernels.feasibility import covering_sample
from tuner.kernels.variant import Variant
from tuner.problem import Problem
from tuner.runtime.build import build_many
from tuner.runtime.verify import TOLERANCE, keys_kept, make_inputs

# Relative L2 error allowed for each gradient against fp32 autograd, by dtype: twice the forward's (each gradient
# passes two 16-bit roundings the output does not: P and dS feed the tensor cores as fp16/bf16).
GRAD_TOLERANCE = {name: 2 * tol for name, tol in TOLERANCE.items()}
FORWARD_TEMPLATE = "attn_fwd_mma"


def reference_forward(q: Any, k: Any, v: Any, causal: bool, scale: float | None = None,
                      window: tuple[int, int] = (-1, -1), softcap: float = 0.0) -> tuple[Any, Any]:
    """fp32 (output, lse) of [B, H, Sq, D] q and [B, Hkv, Sk, D] k, v (float32, differentiable): lse in natural
    log, -inf for a row that sees no key, whose output is 0."""
    import torch

    b, h, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    k = k.repeat_interleave(h // hkv, dim=1)
    v = v.repeat_interleave(h // hkv, dim=1)
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if softcap > 0:
        s = torch.tanh(s / softcap) * softcap
    s = s.masked_fill(~keys_kept(sq, sk, sk, causal, q.device, window), float("-inf"))
    m = s.amax(dim=-1, keepdim=True).detach()  # the softmax does not depend on it
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(s - m)
    l = p.sum(dim=-1, keepdim=True)
    out = torch.matmul(p, v) / torch.where(l > 0, l, torch.ones_like(l))
    lse = torch.where(l[..., 0] > 0, m[..., 0] + torch.log(l[..., 0]), torch.full_like(l[..., 0], float("-inf")))
    return out, lse


def reference_grads(q: Any, k: Any, v: Any, do: Any, causal: bool, scale: float | None = None,
                    window: tuple[int, int] = (-1, -1), softcap: float = 0.0) -> tuple[Any, Any, Any]:
    """fp32 dq, dk, dv of sum(out * do) (out: reference_forward's) at the 16-bit inputs, by autograd."""
    import torch

    with torch.enable_grad():
        q32, k32, v32 = (t.detach().float().requires_grad_(True) for t in (q, k, v))
        out, _ = reference_forward(q32, k32, v32, causal, scale, window, softcap)
        dq, dk, dv = torch.autograd.grad(out, (q32, k32, v32), do.float())
    return dq, dk, dv


def problem_grads(problem: Problem, q: Any, k: Any, v: Any, do: Any, scale: float) -> tuple[Any, Any, Any]:
    """reference_grads with every mask feature of the problem."""
    return reference_grads(q, k, v, do, problem.causal, scale, (problem.window_left, problem.window_right),
                           problem.softcap)


def grad_noise_floors(q: Any, k: Any, v: Any, do: Any, causal: bool, scale: float | None = None,
                      window: tuple[int, int] = (-1, -1), softcap: float = 0.0) -> dict[str, float]:
    """Each gradient's absolute error floor (L2): the 16-bit dtype's epsilon times the norm of the sum of its terms'
    magnitudes, i.e. the size of the rounding error of computing it from these inputs (the standard bound on a sum's
    rounding error), which no cancellation shrinks:
        dS~ = P * (|dO V^T| + |rowsum(dO * O)|)   (dS = P * (dO V^T - rowsum(dO * O)) without its cancellation)
        dq: eps * scale * ||dS~ |K| ||,  dk: eps * scale * ||dS~^T |Q| || (group-summed),  dv: eps * || P^T |dO| ||
    (the softcap's derivative, at most 1, left out: the floor is an upper bound). Where a gradient is that small its
    value is rounding, so its error is measured against the floor (grad_error); elsewhere the floor is below the
    gradient's norm (at most 0.36 of it over benchmarks/bwd_mma_check.py's cases with Sk > 1, against
    2e4 to 9e4 times dQ's and dK's norm at Sk = 1) and the error is plain relative L2."""
    import torch

    eps = torch.finfo(q.dtype).eps
    _, h, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    group = h // hkv
    with torch.no_grad():
        q32, k32, v32, do32 = (t.detach().float() for t in (q, k, v, do))
        ke, ve = k32.repeat_interleave(group, dim=1), v32.repeat_interleave(group, dim=1)
        s = torch.matmul(q32, ke.transpose(-1, -2)) * scale
        if softcap > 0:
            s = torch.tanh(s / softcap) * softcap
        s = s.masked_fill(~keys_kept(sq, sk, sk, causal, q.device, window), float("-inf"))
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a row that sees no key: all -inf, no weight
        del s
        delta = (do32 * torch.matmul(p, ve)).sum(-1, keepdim=True).abs()
        ds = p * (torch.matmul(do32, ve.transpose(-1, -2)).abs() + delta)

        def group_sum(t: Any) -> Any:
            return t.unflatten(1, (hkv, group)).sum(2)

        floors = {"dq": scale * torch.linalg.vector_norm(torch.matmul(ds, ke.abs())).item(),
                  "dk": scale * torch.linalg.vector_norm(group_sum(torch.matmul(ds.transpose(-1, -2),
                                                                                q32.abs()))).item(),
                  "dv": torch.linalg.vector_norm(group_sum(torch.matmul(p.transpose(-1, -2), do32.abs()))).item()}
    return {name: eps * f for name, f in floors.items()}


def problem_noise_floors(problem: Problem, q: Any, k: Any, v: Any, do: Any, scale: float) -> dict[str, float]:
    """grad_noise_floors with every mask feature of the problem."""
    return grad_noise_floors(q, k, v, do, problem.causal, scale, (problem.window_left, problem.window_right),
                             problem.softcap)


def grad_error(got: Any, want: Any, floor: float = 0.0) -> float:
    """||got - want|| / max(||want||, floor) in fp64 (floor: grad_noise_floors'); NaN or inf anywhere in got gives
    inf. Where the exact gradient is zero (the reference then holds rounding noise) a got of rounding size passes and
    one of a real gradient's size fails; elsewhere (floor < ||want||) it is the relative L2 error."""
    import torch

    o = got.double()
    if not torch.isfinite(o).all():
        return float("inf")
    r = want.double()
    denom = max(torch.linalg.vector_norm(r).item(), floor)
    return torch.linalg.vector_norm(o - r).item() / (denom if denom > 0 else 1.0)


@dataclass(frozen=True)
class GradCheck:
    """One backward variant on one problem: each gradient's error (grad_error: relative L2, its denominator floored at
    the gradient's rounding scale; inf: NaN or an unwritten element)."""

    variant: str
    errors: dict[str, float]
    tolerance: float

    @property
    def ok(self) -> bool:
        return all(e < self.tolerance for e in self.errors.values())

    def line(self, label: str) -> str:
        worst = max(self.errors.values())
        errs = " ".join(f"{k} {e:.2e}" for k, e in self.errors.items())
        return f"{'ok  ' if self.ok else 'FAIL'} {label:44s} {self.variant:60s} {errs} (max {worst:.2e}, tol {self.tolerance:.0e})"


def forward_outputs(problem: Problem, q: Any, k: Any, v: Any, scale: float, arch: str, profile: Any) -> tuple[Any, Any]:
    """Our forward's (o, lse) on the inputs: a variant of the sm_80 forward (its covering sample's first)."""
    import torch

    variant = covering_sample(FORWARD_TEMPLATE, problem, profile, seed=0)[0]
    built = build_many([variant], arch)[0]
    if not built.ok:
        raise RuntimeError(f"{variant.name} failed to compile:\n{built.compiled.log[-2000:]}")
    o = torch.empty_like(q)
    lse = torch.empty(problem.batch, problem.heads, problem.seq_q, device=q.device, dtype=torch.float32)
    built.load()(q, k, v, o, lse, scale)
    return o, lse


def check_backward(problem: Problem, variants: Sequence[Variant], profile: Any, seed: int = 0) -> list[GradCheck]:
    """Each backward variant on fresh inputs (o and lse from our forward), its dq, dk, dv NaN-poisoned first,
    against fp32 autograd of the reference (grad_error, floored by problem_noise_floors)."""
    import torch

    from tuner.runtime.backward_launch import BackwardKernel

    arch = profile.nvcc_arch
    scale = 1.0 / math.sqrt(problem.head_dim)
    q, k, v = make_inputs(problem, seed=seed)
    do = torch.randn(q.shape, device=q.device, dtype=q.dtype, generator=torch.Generator(q.device).manual_seed(seed + 1))
    o, lse = forward_outputs(problem, q, k, v, scale, arch, profile)
    ref = problem_grads(problem, q, k, v, do, scale)
    floors = problem_noise_floors(problem, q, k, v, do, scale)
    checks = []
    for variant, built in zip(variants, build_many(list(variants), arch)):
        if not built.ok:
            raise RuntimeError(f"{variant.name} failed to compile:\n{built.compiled.log[-2000:]}")
        grads = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
        dq, dk, dv = BackwardKernel(built)(q, k, v, o, lse, do, scale, grads=grads)
        torch.cuda.synchronize()
        errors = {name: grad_error(got, want, floors[name])
                  for name, got, want in zip(("dq", "dk", "dv"), (dq, dk, dv), ref)}
        checks.append(GradCheck(variant.name, errors, GRAD_TOLERANCE[problem.dtype]))
    return checks
