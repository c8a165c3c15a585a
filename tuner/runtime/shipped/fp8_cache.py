"""attention() with an FP8 KV cache: 16-bit q with float8_e4m3fn k and v and their k_scale / v_scale.

Part of the runtime every export ships (this folder, copied whole). vLLM's FP8 KV cache: k and v are stored as
float8_e4m3fn, real = stored * scale, with float32 scales per tensor (0-dim or one element), per K/V head
([Hkv]) or per batch row and K/V head ([B, Hkv]); the output has q's dtype. The decode kernels tuned for such
a cache (dtype fp16_kv_e4m3 / bf16_kv_e4m3) read it as it is, dense (with or without seq_lens) or paged,
widening k and v in registers. Elsewhere (no such kernel for the call, a cell routed to SDPA, fallback="sdpa"
for inputs the kernels cannot take) k and v are dequantised to q's dtype, gathered from their pages first,
and SDPA runs on them.
"""

from dataclasses import replace
from typing import Any, Optional

import torch

from . import paged as _paged
from .choice import DTYPES, FALLBACKS, check_structure, choose_kernel, refuse_grads
from .dispatch import Key
from .dtypes import DTYPES as _SPECS, ELEMENTS
from .launcher import AttentionInputError, GpuUnavailableError, check_attention_tensors, check_paged_inputs
from .masked import fallback_call
from .seq_lens import check_seq_lens, sdpa_with_lens

FP8 = torch.float8_e4m3fn
# The q dtypes an FP8 cache comes under: the registry's (its copy in dtypes.py) FP8 KV cache dtypes.
_CACHE_QUERIES = tuple(getattr(torch, ELEMENTS[s["query"]]["torch"]) for s in _SPECS.values() if s["kv"] != s["query"])
KV_SUFFIX = "_kv_e4m3"  # a package's dtype of an FP8 cache: the query dtype's name with this (Problem's names)
# A call's layout (shapes, strides, dtypes, devices, causal, mask, form) once validated -> (device, the decode
# kernel, or None: the dequantising fallback)
_cache: dict[tuple, tuple[int, Any]] = {}


def is_fp8_cache(q: Any, k: Any, v: Any) -> bool:
    """Whether a call is the FP8-cache form: 16-bit q, float8_e4m3fn k or v."""
    return (isinstance(q, torch.Tensor) and q.dtype in _CACHE_QUERIES
            and any(isinstance(t, torch.Tensor) and t.dtype == FP8 for t in (k, v)))


def scale_errors(q: Any, k: Any, v: Any, k_scale: Any, v_scale: Any, paged: bool = False) -> list[str]:
    """What is wrong with an FP8-cache call's dtypes and scales (empty: nothing). k and v are [B, Hkv, Sk, D]
    (paged: [pages, page_size, Hkv, D])."""
    if not is_fp8_cache(q, k, v):
        return ["k_scale and v_scale scale an FP8 KV cache: float16 or bfloat16 q with float8_e4m3fn k and v"]
    if not (isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor) and k.dtype == v.dtype == FP8):
        return [f"an FP8 KV cache has k and v both float8_e4m3fn (got {getattr(k, 'dtype', k)}, "
                f"{getattr(v, 'dtype', v)})"]
    if k_scale is None or v_scale is None:
        return ["float8_e4m3fn k and v need k_scale and v_scale (float32: one, [Hkv] or [B, Hkv]; real = stored * "
                "scale)"]
    if q.dim() != 4 or k.dim() != 4:
        return [f"an FP8 KV-cache call takes rank-4 q and k (got q {tuple(q.shape)}, k {tuple(k.shape)})"]
    hkv = k.shape[2] if paged else k.shape[1]
    shapes = ((), (1,), (hkv,), (q.shape[0], hkv))
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if (not isinstance(s, torch.Tensor) or s.dtype != torch.float32 or tuple(s.shape) not in shapes
                or s.device != q.device):
            return [f"{name} must be a float32 tensor of shape (), (1,), ({hkv},) or ({q.shape[0]}, {hkv}) on "
                    f"{q.device} (got {getattr(s, 'dtype', type(s).__name__)} {tuple(getattr(s, 'shape', ()))})"]
    return []


def full_scales(q: Any, hkv: int, k_scale: Any, v_scale: Any) -> tuple[Any, Any]:
    """The checked scales as the kernels read them: contiguous float32 [B, Hkv] (no copy when they are)."""
    want = (q.shape[0], hkv)
    return tuple(s if tuple(s.shape) == want and s.is_contiguous() else s.reshape(-1).expand(want).contiguous()
                 if s.dim() < 2 else s.contiguous() for s in (k_scale, v_scale))


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: Optional[float],
            fallback: Optional[str], seq_lens: Optional[torch.Tensor], block_table: Optional[torch.Tensor],
            mask: tuple, k_scale: torch.Tensor, v_scale: torch.Tensor) -> torch.Tensor:
    """An FP8-cache call (attention() with k_scale and v_scale); `mask` is the checked call_mask()."""
    paged = block_table is not None
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback must be None or 'sdpa', got {fallback!r}")
    tensors = (q, k, v, k_scale, v_scale, seq_lens, block_table)
    layout = tuple((t.shape, t.stride(), t.dtype, t.device) if isinstance(t, torch.Tensor) else type(t)
                   for t in tensors) + (bool(causal), mask)
    hit = _cache.get(layout)  # a layout seen before: its scales' checks and the kernel choice hold
    if hit is None or q.get_device() != hit[0] or any(t.data_ptr() % 16 for t in (q, k, v)) \
            or (torch.is_grad_enabled() and q.requires_grad):
        errors = scale_errors(q, k, v, k_scale, v_scale, paged)
        if errors:  # nothing can compute it, fallback or not
            raise AttentionInputError(errors[0])
        hit = _resolve(q, k, v, causal, fallback, seq_lens, block_table, mask, layout)
    scales = full_scales(q, k.shape[2] if paged else k.shape[1], k_scale, v_scale)
    kernel = hit[1]
    if kernel is None:
        return _dequantised_call(q, k, v, causal, scale, seq_lens, block_table, mask, scales)
    out = torch.empty_like(q)
    if paged:
        kernel.paged(q, k, v, out, block_table, seq_lens, scale, check=False, descales=(None, *scales))
    else:
        kernel.launch_unchecked(q, k, v, out, None, scale, seq_lens, (None, *scales))
    return out


def as_cache_key(key: Key) -> Key:
    """A 16-bit call's key as the same call's over an FP8 cache: the package's <q dtype>_kv_e4m3 entries."""
    return replace(key, dtype=key.dtype + KV_SUFFIX)


def cache_key(q: Any, k: Any, causal: bool, mask: tuple, block_table: Any = None, seq_lens: bool = False) -> Key:
    """The dispatch key of an FP8-cache call (paged: k is [pages, page_size, Hkv, D], the key paged.paged_key's)."""
    if block_table is not None:
        return as_cache_key(_paged.paged_key(q, k, block_table, causal, mask))
    b, h, sq, d = q.shape
    return as_cache_key(Key.of(DTYPES[q.dtype], d, causal, h, k.shape[1], sq, k.shape[2], batch=b, mask=mask,
                               seq_lens=seq_lens))


def _resolve(q: Any, k: Any, v: Any, causal: bool, fallback: Optional[str], seq_lens: Any, block_table: Any,
             mask: tuple, layout: tuple) -> tuple[int, Any]:
    """Validate fully and choose the decode kernel, remembered per layout: (device, kernel or None). Inputs no
    kernel can take raise unless fallback="sdpa" (then None: the dequantising fallback, not remembered)."""
    paged = block_table is not None
    if any(t is not None and not isinstance(t, torch.Tensor) for t in (seq_lens, block_table)):
        raise AttentionInputError("seq_lens and block_table must be torch.Tensors (int32)")
    if paged:
        if seq_lens is None:
            raise AttentionInputError("a paged call needs seq_lens (int32 [B]) with its block_table")
        _paged.check_paged_structure(q, k, v, block_table, seq_lens)
    else:
        check_structure(q, k, v)
        if seq_lens is not None:
            check_seq_lens(q, seq_lens)
    try:
        if paged:
            check_attention_tensors(q, q, q, q)
            check_paged_inputs(q, k, v, block_table, seq_lens)
        else:
            check_attention_tensors(q, k, v, q)
        refuse_grads(q, k, v)
        kernel = choose_kernel(q, cache_key(q, k, causal, mask, block_table, seq_lens is not None))
    except (AttentionInputError, GpuUnavailableError):
        if fallback == "sdpa":
            return (q.get_device(), None)
        raise
    if kernel is not None and not kernel.shape.kv_fp8:
        raise AttentionInputError(f"{kernel.entry} is not an FP8-cache kernel (its manifest launch lacks kv_fp8)")
    if len(_cache) >= 256:  # a server's shapes vary: keep the cache bounded
        _cache.clear()
    chosen = (q.get_device(), kernel)
    _cache[layout] = chosen
    return chosen  # not _cache[layout]: another thread may clear the cache in between


def dequantised(t: Any, scale: Any, dtype: Any, out: Any = None) -> Any:
    """An FP8 cache tensor [B, Hkv, S, D] times its [B, Hkv] scale, in `dtype` (into `out` when given)."""
    real = t.float() * scale[:, :, None, None]
    return real.to(dtype) if out is None else out.copy_(real)


def _dequantised_call(q: Any, k: Any, v: Any, causal: bool, scale: Optional[float], seq_lens: Any, block_table: Any,
                      mask: tuple, scales: tuple) -> torch.Tensor:
    """SDPA (masked for lengths and windows; the softcap implementation with a softcap) on k and v in q's dtype."""
    if block_table is not None:  # the pages gathered into dense K/V
        seq_lens = seq_lens.clamp(max=block_table.shape[1] * k.shape[1])  # as the decode kernels clamp
        k, v = _paged.gather_pages(k, block_table), _paged.gather_pages(v, block_table)
    k, v = dequantised(k, scales[0], q.dtype), dequantised(v, scales[1], q.dtype)
    if seq_lens is not None:
        return sdpa_with_lens(q, k, v, causal, scale, seq_lens, mask)
    return fallback_call(q, k, v, causal, scale, mask)
