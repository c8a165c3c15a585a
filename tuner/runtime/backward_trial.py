"""A backward problem's trial in the GPU worker: what a variant is fed (q, k, v, a fixed dO, and the forward's O and
lse, made once per problem), the fp32 autograd reference of dQ, dK and dV it is checked against (each gradient on
its own, tuner.runtime.backward_verify's error and tolerance), and the baselines timed on the same O and lse.

O and lse come from the fp32 reference forward (O rounded to the inputs' dtype): every variant and every baseline
computes the same gradients from the same saved tensors, as a training step's backward does. The reference runs one
(batch row, K/V head) at a time, so its fp32 scores never exceed one GQA group's [group, Sq, Sk].

Baselines: SDPA's flash and cuDNN backward, the aten backward ops on that O and lse (tuner.runtime.shipped.backward's
run_backward, as an export's differentiable path calls them: K/V expanded over a GQA group and dK, dV summed back;
cuDNN's only where its causal mask is ours, Sq == Sk), and FlashAttention-4's backward (flash_attn.cute, through
autograd of its own forward) where it imports and takes the problem."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

from tuner.problem import Problem
from tuner.runtime.backward_verify import GRAD_TOLERANCE, grad_error, grad_noise_floors, reference_forward
from tuner.runtime.baseline_log import warnings_logged
from tuner.runtime.baselines import FA4, Baseline, fa4_function, fa4_if_it_runs, fa4_kwargs, sdpa_skipped

GRADS = ("dq", "dk", "dv")


@dataclass(frozen=True)
class GradReference:
    """The fp32 dq, dk, dv of a problem's inputs and each one's noise floor (backward_verify.grad_noise_floors)."""

    grads: tuple[Any, Any, Any]
    floors: dict[str, float]

    def errors(self, got: tuple[Any, Any, Any]) -> dict[str, float]:
        """Each gradient's grad_error (relative L2, floored; inf for NaN or an unwritten element)."""
        return {name: grad_error(g, want, self.floors[name]) for name, g, want in zip(GRADS, got, self.grads)}

    def describe(self, got: tuple[Any, Any, Any]) -> str:
        """Each gradient's error, e.g. "dq 1.2e-03, dk 4.0e-02, dv 9.1e-04": which one failed."""
        return ", ".join(f"{name} {e:.1e}" for name, e in self.errors(got).items())

    def error(self, got: tuple[Any, Any, Any]) -> float:
        """The worst gradient's error: what a trial stores as its rel_error and checks against the tolerance."""
        return max(self.errors(got).values())


def grad_tolerance(problem: Problem) -> float:
    return GRAD_TOLERANCE[problem.dtype]


def backward_inputs(problem: Problem, q: Any, k: Any, v: Any, scale: float, seed: int) -> dict[str, Any]:
    """dO (seeded), the forward's O (like q) and lse (float32 [B, H, Sq]), and the GradReference of the inputs."""
    import torch

    gen = torch.Generator(q.device).manual_seed(seed + 1)
    do = torch.empty_like(q).copy_(torch.randn(q.shape, device=q.device, dtype=q.dtype, generator=gen))  # q's layout
    o = torch.empty_like(q)
    lse = torch.empty(problem.batch, problem.heads, problem.seq_q, device=q.device, dtype=torch.float32)
    grads = (torch.empty_like(q, dtype=torch.float32), torch.empty_like(k, dtype=torch.float32),
             torch.empty_like(v, dtype=torch.float32))
    squares = dict.fromkeys(GRADS, 0.0)
    group = problem.heads // problem.heads_kv
    window = (problem.window_left, problem.window_right)
    for b in range(problem.batch):
        for h in range(problem.heads_kv):
            rows, kv = (slice(b, b + 1), slice(h * group, (h + 1) * group)), (slice(b, b + 1), slice(h, h + 1))
            parts = (q[rows], k[kv], v[kv], do[rows])
            with torch.enable_grad():
                q32, k32, v32 = (t.detach().float().requires_grad_(True) for t in parts[:3])
                out, lse_part = reference_forward(q32, k32, v32, problem.causal, scale, window, problem.softcap)
                dq, dk, dv = torch.autograd.grad(out, (q32, k32, v32), parts[3].float())
            o[rows], lse[rows] = out.detach().to(q.dtype), lse_part.detach()
            grads[0][rows], grads[1][kv], grads[2][kv] = dq, dk, dv
            floors = grad_noise_floors(*parts, problem.causal, scale, window, problem.softcap)
            for name in GRADS:
                squares[name] += floors[name] ** 2
    return {"do": do, "o": o, "lse": lse,
            "ref": GradReference(grads, {name: math.sqrt(s) for name, s in squares.items()})}


def poisoned_grads(data: dict[str, Any]) -> tuple[Any, Any, Any]:
    """dq, dk, dv laid out like q, k, v, filled with NaN so an unwritten element shows."""
    import torch

    return tuple(torch.full_like(data[name], float("nan")) for name in ("q", "k", "v"))  # type: ignore[return-value]


def backward_call(kernel: Any, data: dict[str, Any], grads: tuple[Any, Any, Any], checked: bool) -> Callable[[], Any]:
    """A backward variant's three launches (tuner.runtime.backward_launch.BackwardKernel) on the problem's inputs:
    `checked` checks the inputs at each call (the verify launch), else once, here (what is timed: the launches alone,
    as a forward's launch_unchecked)."""
    args = tuple(data[n] for n in ("q", "k", "v", "o", "lse", "do", "scale"))
    if checked:
        return lambda: kernel(*args, grads=grads)
    return kernel.launcher(*args, grads=grads)


def backward_baselines(problem: Problem, data: dict[str, Any], fa4: bool = True) -> list[Baseline]:
    """SDPA's flash and cuDNN backward on the problem's O and lse where they take it, and FA4's backward where it
    imports and runs it (first calls made here, outside any timing)."""
    import torch

    from tuner.runtime.shipped.backward import CUDNN, FLASH, cudnn_stats_form, run_backward

    q, k, v, o, lse, do, scale = (data[n] for n in ("q", "k", "v", "o", "lse", "do", "scale"))
    skipped = sdpa_skipped(problem)
    if problem.causal and problem.seq_q != problem.seq_k:  # cuDNN's causal mask is top-left, ours bottom-right
        skipped = {**skipped, "sdpa_cudnn": "its causal mask is top-left"}
    found = []
    for name, kind in (("sdpa_flash", FLASH), ("sdpa_cudnn", CUDNN)):
        if name in skipped or (kind == CUDNN and isinstance(cudnn_stats_form(q), str)):
            continue
        call = (lambda kind: lambda: run_backward(kind, do, q, k, v, o, lse, problem.causal, scale))(kind)
        try:
            call()
            torch.cuda.synchronize()
        except RuntimeError:  # this backend does not take the problem on this card
            continue
        found.append(Baseline(name, call, None))
    extra = fa4_backward(problem, data) if fa4 else None
    return found + ([extra] if extra is not None else [])


def fa4_backward(problem: Problem, data: dict[str, Any]) -> Optional[Baseline]:
    """FlashAttention-4's backward: dq, dk, dv by autograd of its forward (run once here, on [B, S, H, D] copies made
    outside the timed call); None where it does not import or rejects the problem."""
    import torch

    forward = fa4_function("flash_attn_func")
    if forward is None:
        return None
    qb, kb, vb = (data[n].transpose(1, 2).contiguous().requires_grad_(True) for n in ("q", "k", "v"))
    dob = data["do"].transpose(1, 2).contiguous()
    kwargs = fa4_kwargs(data["scale"], problem.causal, (problem.window_left, problem.window_right), problem.softcap)
    try:
        with torch.enable_grad(), warnings_logged(FA4, "compile and first call"):
            result = forward(qb, kb, vb, **kwargs)
    except Exception:  # a shape, dtype, head dim or feature it does not take: no baseline
        return None
    out = result[0] if isinstance(result, tuple) else result  # some versions return (out, lse)
    return fa4_if_it_runs(lambda: torch.autograd.grad(out, (qb, kb, vb), dob, retain_graph=True), qb.is_cuda)
