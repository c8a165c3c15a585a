"""FP8 (E4M3) inputs as FlashAttention-3 takes them: fp8 q, k, v and float32 descales [B, Hkv].

The real value of an element is its fp8 value times the descale of its batch row and K/V head; q's descale
is per K/V head too, shared by the q heads of the group (q head h uses descale[:, h // (H // Hkv)]). Each
descale is amax / 448 over what it scales, so the largest element lands on e4m3's largest finite value.
"""

from __future__ import annotations

from typing import Any, NamedTuple

E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max


class Descales(NamedTuple):
    """float32 [B, Hkv] descale factors of q, k and v (real value = fp8 value * descale); a tuple, so it
    passes as the launcher's `descales=(q_descale, k_descale, v_descale)`."""

    q: Any
    k: Any
    v: Any


def per_head(descale: Any, heads_per_kv: int) -> Any:
    """[B, Hkv] descales as [B, Hkv * heads_per_kv]: each q head of a group gets its K/V head's factor."""
    return descale.repeat_interleave(heads_per_kv, dim=1) if heads_per_kv > 1 else descale


def quantize(x: Any, heads_per_kv: int = 1) -> tuple[Any, Any]:
    """x [B, H, S, D] (real values; any strides) as (fp8 e4m3 tensor laid out like x, float32 descale
    [B, H // heads_per_kv]): descale = amax / 448 over each batch row and K/V head (its heads_per_kv
    heads together), an all-zero group getting 1."""
    import torch

    b, h = x.shape[0], x.shape[1]
    amax = x.detach().float().abs().reshape(b, h // heads_per_kv, -1).amax(dim=-1)
    descale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    scaled = x.float() / per_head(descale, heads_per_kv)[:, :, None, None]
    out = torch.empty_like(x, dtype=torch.float8_e4m3fn)  # empty_like keeps a dense view's strides (BSHD)
    out.copy_(scaled.clamp(-E4M3_MAX, E4M3_MAX))  # amax / descale can round a hair past 448: saturate
    return out, descale


def dequantized(t: Any, descale: Any, heads_per_kv: int = 1, dtype: Any = None) -> Any:
    """The real values of fp8 t [B, H, S, D] with its [B, H // heads_per_kv] descale, in `dtype` (default
    float32: the product rounds at 2^-24, far below any tolerance; bf16 for the baselines), laid out like t."""
    import torch

    dtype = torch.float32 if dtype is None else dtype
    out = torch.empty_like(t, dtype=dtype)
    out.copy_(t.float() * per_head(descale.float(), heads_per_kv)[:, :, None, None])
    return out


def dequantized_inputs(q: Any, k: Any, v: Any, descales: Descales, dtype: Any = None) -> tuple[Any, Any, Any]:
    """dequantized() of q, k and v (q's group size from the head counts): the problem's real values. An FP8
    KV cache's q (Descales.q None) is real already: converted to `dtype` (float32 by default) alone."""
    import torch

    group = q.shape[1] // k.shape[1]
    real_q = q.to(torch.float32 if dtype is None else dtype) if descales.q is None else \
        dequantized(q, descales.q, group, dtype)
    return real_q, dequantized(k, descales.k, 1, dtype), dequantized(v, descales.v, 1, dtype)
