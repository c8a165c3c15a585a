"""What the kernels take, checked before a launch: each check raises AttentionInputError naming the first limit
the tensors break (the launcher re-exports them)."""

from __future__ import annotations

from typing import Any

from .cuda_driver import AttentionInputError
from .dtypes import ELEMENTS
from .fp8 import is_fp8

_ELEMENT_TYPES = {f"torch.{e['torch']}" for e in ELEMENTS.values()}  # what the kernels take: the registry's types


def check_attention_tensors(q: Any, k: Any, v: Any, out: Any, lse: Any = None) -> None:
    """Raise AttentionInputError naming the first limit the tensors break."""
    import torch

    for name, t in (("q", q), ("k", k), ("v", v), ("out", out)):
        if not isinstance(t, torch.Tensor):
            raise AttentionInputError(f"{name} must be a torch.Tensor")
        if not t.is_cuda:
            raise AttentionInputError(f"{name} must be a CUDA tensor (got device {t.device})")
        if t.dim() != 4:
            raise AttentionInputError(f"{name} must have rank 4 [B, H, S, D] (got shape {tuple(t.shape)})")
        want = torch.bfloat16 if name == "out" and is_fp8(q) else q.dtype  # e4m3 inputs write bf16
        fp8_cache = name in ("k", "v") and is_fp8(t) and not is_fp8(q) and is_fp8(k) and is_fp8(v)
        if str(t.dtype) not in _ELEMENT_TYPES or (t.dtype != want and not fp8_cache):
            raise AttentionInputError(f"{name} must be float16, bfloat16 or float8_e4m3fn like q (k and v may both be "
                                      f"float8_e4m3fn: an FP8 KV cache), out bfloat16 for float8_e4m3fn q (got "
                                      f"{t.dtype}, q is {q.dtype})")
        check_strides(name, t)
    if not (q.device == k.device == v.device == out.device):
        raise AttentionInputError(f"q, k, v and out must be on one device (got {q.device}, {k.device}, {v.device}, "
                                  f"{out.device})")
    b, h, sq, d = q.shape
    if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d:
        raise AttentionInputError(
            f"k and v must be [B, Hkv, Sk, D] matching q's B and D (q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)})")
    if h % k.shape[1]:
        raise AttentionInputError(f"q heads ({h}) must be a multiple of k/v heads ({k.shape[1]})")
    if tuple(out.shape) != tuple(q.shape):
        raise AttentionInputError(f"out must have q's shape {tuple(q.shape)} (got {tuple(out.shape)})")
    if lse is not None and (lse.dtype != torch.float32 or tuple(lse.shape) != (b, h, sq) or not lse.is_contiguous()):
        raise AttentionInputError(f"lse must be a contiguous float32 tensor of shape {(b, h, sq)}")


def check_strides(name: str, t: Any) -> None:
    """The strides a kernel reads a rank-4 tensor through: the last dim contiguous, the others and the data
    16-byte aligned (TMA's and the 16-byte loads' rule)."""
    if t.stride(3) != 1:
        raise AttentionInputError(f"{name} must be contiguous in the head dim (stride {t.stride(3)})")
    align = 16 // t.element_size()
    if any(s % align for s in t.stride()[:3]) or t.data_ptr() % 16:
        raise AttentionInputError(f"{name} strides must be multiples of {align} elements (16 bytes) and its data "
                                  f"16-byte aligned")


def check_paged_inputs(q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any) -> None:
    """Raise AttentionInputError naming the first limit a paged call breaks: k_cache and v_cache
    [pages, page_size, Hkv, D] (vLLM's layout, page_size a power of two from 16 to 256), block_table
    int32 [B, pages_per_seq] and seq_lens int32 [B], contiguous, on q's device."""
    import torch

    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise AttentionInputError(f"{name} must be a rank-4 tensor [pages, page_size, Hkv, D]")
    pages, page, hkv, d = k_cache.shape
    fp8_cache = is_fp8(k_cache) and is_fp8(v_cache) and not is_fp8(q)  # an FP8 KV cache with 16-bit queries
    if (k_cache.dtype != v_cache.dtype or (k_cache.dtype != q.dtype and not fp8_cache) or k_cache.device != q.device
            or v_cache.device != q.device):
        raise AttentionInputError(f"k_cache and v_cache must have q's dtype (or both float8_e4m3fn: an FP8 cache) and "
                                  f"device ({q.dtype} on {q.device}; got {k_cache.dtype} on {k_cache.device}, "
                                  f"{v_cache.dtype} on {v_cache.device})")
    if v_cache.shape != k_cache.shape or d != q.shape[-1] or q.shape[1] % max(hkv, 1):
        raise AttentionInputError(f"k_cache and v_cache must be [pages, page_size, Hkv, D] with q's D and Hkv dividing "
                                  f"q's heads (q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}, "
                                  f"v_cache {tuple(v_cache.shape)})")
    if page not in (16, 32, 64, 128, 256):
        raise AttentionInputError(f"page_size must be 16, 32, 64, 128 or 256 (got {page})")
    b = q.shape[0]
    for name, t, dims in (("block_table", block_table, 2), ("seq_lens", seq_lens, 1)):
        if (not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != dims or t.shape[0] != b
                or not t.is_contiguous() or t.device != q.device):
            want = f"({b}, pages_per_seq)" if dims == 2 else f"({b},)"
            raise AttentionInputError(f"{name} must be a contiguous int32 tensor of shape {want} on {q.device}")
    if block_table.shape[1] < 1 or pages < 1:
        raise AttentionInputError(f"a paged cache needs at least one page (block_table {tuple(block_table.shape)}, "
                                  f"k_cache {tuple(k_cache.shape)})")
    # The kernel reads pages through k_cache.transpose(1, 2): [pages, Hkv, page_size, D], a strided 4-D tensor.
    check_strides("k_cache", k_cache.transpose(1, 2))
    check_strides("v_cache", v_cache.transpose(1, 2))


def check_packed_inputs(q: Any, k: Any, v: Any, out: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, max_seqlen_q: Any,
                        max_seqlen_k: Any, lse: Any = None) -> None:
    """Packed sequences (FlashAttention's varlen form) as the packed kernels take them: check_packed_structure, then
    q and out [total_q, H, D], k and v [total_k, Hkv, D] float16 or bfloat16 alike on one CUDA device with the
    kernels' strides, cu_seqlens contiguous (sequence b's rows are cu[b] .. cu[b+1] - 1), lse float32 [H, total_q].
    max_seqlen must bound every sequence's length: not checked on the GPU (a longer sequence is computed in part)."""
    import torch

    check_packed_structure(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    if not isinstance(out, torch.Tensor) or out.dim() != 3:
        raise AttentionInputError("packed out must be a rank-3 tensor [total, heads, D]")
    check_attention_tensors(*(packed_view(t) for t in (q, k, v, out)))
    if is_fp8(q) or is_fp8(k):
        raise AttentionInputError("packed sequences take float16 or bfloat16 inputs")
    if not (cu_seqlens_q.is_contiguous() and cu_seqlens_k.is_contiguous()):
        raise AttentionInputError("cu_seqlens_q and cu_seqlens_k must be contiguous")
    if lse is not None and (not isinstance(lse, torch.Tensor) or lse.dtype != torch.float32
                            or tuple(lse.shape) != (q.shape[1], q.shape[0]) or not lse.is_contiguous()
                            or lse.device != q.device):
        raise AttentionInputError(f"packed lse must be a contiguous float32 tensor of shape {(q.shape[1], q.shape[0])}")


def check_packed_structure(q: Any, k: Any, v: Any, cu_q: Any, cu_k: Any, max_q: Any, max_k: Any) -> None:
    """What no implementation can compute, so that even fallback="sdpa" raises: shapes that do not pair up, cumulative
    lengths that are not int32 [B + 1] tensors of one length on q's device, max_seqlen that is not a positive int.
    check_packed_inputs adds what the kernels need besides."""
    import torch

    if not all(isinstance(t, torch.Tensor) and t.dim() == 3 for t in (q, k, v)):
        raise AttentionInputError("packed q, k and v must be rank-3 tensors [total, heads, D] (got shapes "
                                  f"{', '.join(str(tuple(getattr(t, 'shape', ()))) for t in (q, k, v))})")
    if k.shape != v.shape or k.shape[2] != q.shape[2] or not k.shape[1] or q.shape[1] % k.shape[1]:
        raise AttentionInputError(f"packed k and v must be [total_k, Hkv, D] with q's D and Hkv dividing q's heads "
                                  f"(q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)})")
    for name, t in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if (not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 1 or t.numel() < 2
                or t.device != q.device):
            got = f"{t.dtype} {tuple(t.shape)} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise AttentionInputError(f"{name} must be an int32 tensor [B + 1] on {q.device} (got {got})")
    if cu_q.numel() != cu_k.numel():
        raise AttentionInputError(f"cu_seqlens_q and cu_seqlens_k must have one length ({cu_q.numel()} != "
                                  f"{cu_k.numel()}): one entry per sequence boundary")
    for name, n in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n < 2**31:
            raise AttentionInputError(f"{name} must be a positive int (got {n!r})")


def packed_view(t: Any) -> Any:
    """A packed [total, heads, D] tensor as the kernels' logical [1, heads, total, D] (no copy)."""
    return t.transpose(0, 1).unsqueeze(0)
