"""tuner export --check of an e4m3 cell: FP8 inputs with their descales, their real values for the fp32
reference, and the fallback timed against the kernels (the package's own: dequantise to bfloat16, then SDPA).

The input maker here stands in for tuner.runtime.verify.fp8_inputs (FlashAttention-3's descales: float32
[B, Hkv], amax / 448 per batch row and K/V head, over the group's q heads for q) until that is on this branch.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

from tuner.problem import Problem

E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
E4M3_TOLERANCE = 5e-2  # relative L2 error of an e4m3 kernel against the fp32 reference on the real values


def tolerance(dtype: str) -> float:
    """The relative L2 error a kernel of `dtype` may have against the fp32 reference (verify.TOLERANCE's)."""
    from tuner.runtime.verify import TOLERANCE

    return TOLERANCE.get(dtype, E4M3_TOLERANCE) if dtype == "e4m3" else TOLERANCE[dtype]


def _per_head(descale: Any, heads_per_kv: int) -> Any:
    """[B, Hkv] descales as [B, H, 1, 1]: each q head of a group gets its K/V head's factor."""
    return descale.repeat_interleave(heads_per_kv, dim=1)[:, :, None, None]


def _quantise(x: Any, heads_per_kv: int) -> tuple[Any, Any]:
    """Real x [B, H, S, D] as (e4m3 tensor laid out like x, float32 descale [B, H // heads_per_kv])."""
    import torch

    b, h = x.shape[0], x.shape[1]
    amax = x.abs().reshape(b, h // heads_per_kv, -1).amax(dim=-1)
    descale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax)).float().contiguous()
    out = torch.empty_like(x, dtype=torch.float8_e4m3fn)
    out.copy_((x / _per_head(descale, heads_per_kv)).clamp(-E4M3_MAX, E4M3_MAX))
    return out, descale


def fp8_inputs(problem: Problem, device: str = "cuda", seed: int = 0) -> tuple[Any, Any, Any, tuple[Any, Any, Any]]:
    """Random e4m3 q, k, v in the problem's layout and their descales (q_descale, k_descale, v_descale): normal
    data, each (batch row, K/V head) scaled by its own power of two in [1/2, 2] so that the descales differ (a
    kernel reading the wrong one fails), quantised per (batch row, K/V head)."""
    import torch

    from tuner.runtime.verify import make_inputs

    real = make_inputs(dataclasses.replace(problem, dtype="bf16"), device, seed)
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    group = problem.heads // problem.heads_kv
    made = []
    for t, heads_per_kv in zip(real, (group, 1, 1)):
        magnitude = 2.0 ** (torch.rand(problem.batch, problem.heads_kv, device=device, generator=gen) * 2 - 1)
        x = torch.empty_like(t, dtype=torch.float32).copy_(t) * _per_head(magnitude, heads_per_kv)
        made.append(_quantise(x, heads_per_kv))
    (q, dq), (k, dk), (v, dv) = made
    return q, k, v, (dq, dk, dv)


def real_values(q: Any, k: Any, v: Any, descales: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
    """The float32 values e4m3 q, k, v with their descales stand for (stored * descale)."""
    group = q.shape[1] // k.shape[1]
    return tuple(t.float() * _per_head(d.float(), g) for t, d, g in zip((q, k, v), descales, (group, 1, 1)))


def dequantising(pkg: Any, baselines: list[Any], q: Any, k: Any, v: Any, descales: tuple[Any, Any, Any],
                 buffers: tuple[Any, Any, Any]) -> list[Any]:
    """`baselines` (timed on `buffers`, the bfloat16 values) as the package's fallback of an FP8 call runs them:
    each call dequantises q, k, v into the buffers first (the package's fp8_call.dequantised), then runs."""
    from tuner.runtime.baselines import Baseline

    fp8 = importlib.import_module(f"{pkg.__name__}._runtime.fp8_call")

    def call(run: Callable[[], Any]) -> Callable[[], Any]:
        return lambda: (fp8.dequantised(q, k, v, descales, buffers), run())[1]

    return [Baseline(b.name, call(b.call), b.backend) for b in baselines]


def dequantised(pkg: Any, q: Any, k: Any, v: Any, descales: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
    """The bfloat16 inputs the package's fallback of an FP8 call runs on."""
    return importlib.import_module(f"{pkg.__name__}._runtime.fp8_call").dequantised(q, k, v, descales)
