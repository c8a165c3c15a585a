"""attention() with float8_e4m3fn inputs: the descales' rules, the e4m3 kernels' dispatch, the dequantising fallback.

Part of the runtime every export ships (this folder, copied whole). An FP8 call passes q, k and v as
torch.float8_e4m3fn with their descales as FlashAttention-3 takes them: float32 [B, Hkv] each, per batch row
and K/V head, real = stored * descale (q's descale is shared by the query heads of a GQA group); the output
is bfloat16. A cell with an e4m3 kernel of the call's head dim, causality, window and softcap runs it (the
kernel folds the descales into its scale and output). Everywhere else the inputs are dequantised to bfloat16
(stored.float() * descale) and the 16-bit fallback runs on them: a cell routed to SDPA, fallback="sdpa" where
no e4m3 kernel takes the call, and every seq_lens or paged call (no decode kernel takes e4m3).
"""

from typing import Any, Optional

import torch

from . import paged as _paged
from .choice import DTYPES, FALLBACKS, cell, check_structure, choose_kernel, refuse_grads, table
from .dispatch import Key
from .fp8 import check_descales
from .launcher import AttentionInputError, GpuUnavailableError, check_attention_tensors
from .masked import fallback_call
from .seq_lens import check_seq_lens, sdpa_with_lens

FP8 = torch.float8_e4m3fn
DESCALES = ("q_descale", "k_descale", "v_descale")
DEQUANTISED = "on the inputs dequantised to bfloat16"  # explain()'s words for the fallback of an FP8 call
# The dispatch cell of an FP8 call (choice.cell) -> (device index, the e4m3 kernel, or None: the fallback)
_fp8_cache: dict[tuple, tuple[int, Any]] = {}


def descale_errors(q: Any, k: Any, v: Any, descales: Optional[tuple]) -> list[str]:
    """What is wrong with a call's dtypes and descales (empty: nothing): float8_e4m3fn q, k and v take all three
    descales, 16-bit ones none. `descales` is None when the call passed none."""
    dtypes = [getattr(t, "dtype", None) for t in (q, k, v)]
    fp8 = [d == FP8 for d in dtypes]
    if descales is None:
        return [] if not any(fp8) else ["float8_e4m3fn inputs need q_descale, k_descale and v_descale (float32 "
                                        "[B, Hkv] each: real = stored * descale)"]
    if not any(fp8):
        return [f"q_descale, k_descale and v_descale scale float8_e4m3fn inputs: pass none with {dtypes[0]} ones"]
    if not all(fp8):
        return [f"q, k and v must all be float8_e4m3fn with descales (got {', '.join(map(str, dtypes))})"]
    missing = [name for name, t in zip(DESCALES, descales) if t is None]
    if missing:
        return [f"float8_e4m3fn inputs need all three descales: {', '.join(missing)} missing"]
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return [f"float8_e4m3fn inputs must have rank 4 [B, H, S, D] (descales are per batch row and K/V head; got "
                f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)})"]
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        return [f"q heads ({q.shape[1]}) must be a multiple of k/v heads ({k.shape[1]})"]
    try:
        check_descales(q, k, descales)
    except AttentionInputError as exc:
        return [str(exc)]
    return []


def check_fp8_call(q: Any, k: Any, v: Any, descales: tuple) -> None:
    """A one-line AttentionInputError naming the first of descale_errors()."""
    errors = descale_errors(q, k, v, descales)
    if errors:
        raise AttentionInputError(errors[0])


def dequantised(q: Any, k: Any, v: Any, descales: tuple, out: Optional[tuple] = None) -> tuple[Any, Any, Any]:
    """The real values of checked FP8 q, k, v in bfloat16, each laid out like its input (into `out` if given):
    stored.float() * descale, q's descale broadcast over its group's heads."""
    group = q.shape[1] // k.shape[1]
    out = out or tuple(torch.empty_like(t, dtype=torch.bfloat16) for t in (q, k, v))
    for t, descale, dst, heads in zip((q, k, v), descales, out, (group, 1, 1)):
        factor = descale.float() if heads == 1 else descale.float().repeat_interleave(heads, dim=1)
        dst.copy_(t.float() * factor[:, :, None, None])
    return out


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: Optional[float],
            fallback: Optional[str], seq_lens: Optional[torch.Tensor], block_table: Optional[torch.Tensor],
            mask: tuple, descales: tuple) -> torch.Tensor:
    """An FP8 call (attention() with descales); `mask` is the checked call_mask()."""
    if seq_lens is not None or block_table is not None:
        return _forward_lens(q, k, v, causal, scale, fallback, seq_lens, block_table, mask, descales)
    qs, ks = q.shape, k.shape
    if len(qs) == 4 and len(ks) == 4 and ks[1] and ks[2] and qs[2]:
        hit = _fp8_cache.get(cell(q.dtype, qs, ks, causal, mask))
        if (hit is not None and fallback in FALLBACKS and q.get_device() == hit[0]
                and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))):
            if hit[1] is None:  # a cell routed to SDPA
                check_fp8_call(q, k, v, descales)
                check_structure(q, k, v)
                return fallback_call(*dequantised(q, k, v, descales), causal, scale, mask)
            check_descales(q, k, descales)  # the kernel's launch_if_fit checks q, k, v (layout cached)
            out = torch.empty_like(q, dtype=torch.bfloat16)
            if hit[1].launch_if_fit(q, k, v, out, None, scale, None, descales):
                return out
    return _slow(q, k, v, causal, scale, fallback, mask, descales)


def _slow(q: Any, k: Any, v: Any, causal: bool, scale: Optional[float], fallback: Optional[str], mask: tuple,
          descales: tuple) -> torch.Tensor:
    """Validate fully, choose the e4m3 kernel (or the fallback) and fill the dispatch cache."""
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback must be None or 'sdpa', got {fallback!r}")
    check_fp8_call(q, k, v, descales)
    check_structure(q, k, v)
    try:
        kernel = _resolve(q, k, v, causal, mask)
    except (AttentionInputError, GpuUnavailableError):
        if fallback == "sdpa":
            return fallback_call(*dequantised(q, k, v, descales), causal, scale, mask)
        raise
    if kernel is None:  # routed to SDPA
        return fallback_call(*dequantised(q, k, v, descales), causal, scale, mask)
    out = torch.empty_like(q, dtype=torch.bfloat16)
    if q.numel():
        kernel(q, k, v, out, None, scale, True, None, descales)  # checked: the dtype and descales too
    return out


def bf16_out_like(q: Any) -> Any:
    """A bfloat16 stand-in for an FP8 call's output in check_attention_tensors (q's shape and device, one row
    of memory): what torch.empty_like(q, dtype=torch.bfloat16) would pass."""
    return torch.empty(q.shape[-1], dtype=torch.bfloat16, device=q.device).expand(q.shape)


def fp8_key(q: Any, k: Any, causal: bool, mask: tuple) -> Key:
    """The dispatch key of an FP8 call (k dense: [B, Hkv, Sk, D])."""
    b, h, sq, d = q.shape
    return Key.of(DTYPES[FP8], d, causal, h, k.shape[1], sq, k.shape[2], batch=b, mask=mask)


def _resolve(q: Any, k: Any, v: Any, causal: bool, mask: tuple) -> Any:
    """The e4m3 kernel of the call (an AttentionKernel) or None for a cell routed to SDPA, remembered per cell."""
    check_attention_tensors(q, k, v, bf16_out_like(q))
    refuse_grads(q, k, v)
    kernel = choose_kernel(q, fp8_key(q, k, causal, mask))
    if kernel is not None and not kernel.shape.fp8:
        raise AttentionInputError(f"{kernel.entry} is not an e4m3 kernel (its manifest launch lacks fp8)")
    _fp8_cache[cell(q.dtype, q.shape, k.shape, causal, mask)] = (q.get_device(), kernel)
    return kernel


def _forward_lens(q: Any, k: Any, v: Any, causal: bool, scale: Optional[float], fallback: Optional[str],
                  seq_lens: Any, block_table: Any, mask: tuple, descales: tuple) -> torch.Tensor:
    """seq_lens and paged FP8 calls: no decode kernel takes e4m3, so the pages are gathered and the inputs
    dequantised for masked SDPA (the softcap implementation with a softcap). Inputs the kernels could not take, or
    a package without any e4m3 kernel of the call's head dim, causality and mask, raise unless fallback="sdpa", as
    a 16-bit call would."""
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback must be None or 'sdpa', got {fallback!r}")
    if seq_lens is None:
        raise AttentionInputError("a paged call needs seq_lens (int32 [B]) with its block_table")
    tensors = (q, k, v) + ((block_table,) if block_table is not None else ())
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        raise AttentionInputError("q, k, v, block_table and seq_lens must be torch.Tensors")
    if block_table is not None:  # k and v are caches [pages, page_size, Hkv, D]: row b's pages, dense
        if q.dim() != 4:
            raise AttentionInputError(f"q must have rank 4 [B, H, Sq, D] (got shape {tuple(q.shape)})")
        _paged.check_paged_structure(q, k, v, block_table, seq_lens)
        seq_lens = seq_lens.clamp(max=block_table.shape[1] * k.shape[1])  # as the decode kernels clamp
        k, v = _paged.gather_pages(k, block_table), _paged.gather_pages(v, block_table)
    check_fp8_call(q, k, v, descales)
    check_structure(q, k, v)
    check_seq_lens(q, seq_lens)
    try:  # what a 16-bit call checks before it runs masked SDPA for want of a decode kernel
        check_attention_tensors(q, k, v, bf16_out_like(q))
        refuse_grads(q, k, v)
        key = fp8_key(q, k, causal, mask)
        if table().choose(key) is None:
            raise AttentionInputError(table().unsupported_reason(key))
    except AttentionInputError:
        if fallback != "sdpa":
            raise
    return sdpa_with_lens(*dequantised(q, k, v, descales), causal, scale, seq_lens, mask)
