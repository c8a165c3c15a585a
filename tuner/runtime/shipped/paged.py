"""attention(q, k_cache, v_cache, block_table=..., seq_lens=...): the paged form.

Part of the runtime every export ships. K and V live in pages of a cache
[pages, page_size, Hkv, D] (vLLM's layout); row b's key n is row n % page_size of page
block_table[b, n // page_size], and row b uses its first seq_lens[b] keys. The decode kernels read
the pages in place (the table and the lengths on the GPU: a captured graph replays with new ones);
any other cell gathers the pages into a dense [B, Hkv, Sk, D] copy for masked SDPA (a window or a softcap
without a decode kernel of its own runs masked.fallback there).
"""

from typing import Any, Optional

import torch

from .choice import DTYPES, FALLBACKS, check_structure, choose_kernel, refuse_grads, refuse_unscaled_fp8
from .dispatch import NO_MASK, Key
from .launcher import AttentionInputError, GpuUnavailableError, check_attention_tensors, check_paged_inputs
from .seq_lens import check_seq_lens, sdpa_with_lens

# A call's layout (shapes, strides, dtypes, devices, causal) once validated -> (device, kernel or None: SDPA)
_paged_cache: dict[tuple, tuple[int, Any]] = {}


def forward_paged(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, causal: bool,
                  scale: Optional[float], fallback: Optional[str], seq_lens: Optional[torch.Tensor],
                  block_table: torch.Tensor, mask: tuple = NO_MASK) -> torch.Tensor:
    """The paged call; `mask` is its (window_left, window_right, softcap), checked (masked.call_mask)."""
    if seq_lens is None:
        raise AttentionInputError("a paged call needs seq_lens (int32 [B]) with its block_table")
    tensors = (q, k_cache, v_cache, block_table, seq_lens)
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        raise AttentionInputError("q, k_cache, v_cache, block_table and seq_lens must be torch.Tensors")
    layout = tuple((t.shape, t.stride(), t.dtype, t.device) for t in tensors) + (bool(causal), mask)
    hit = _paged_cache.get(layout)
    if (hit is None or fallback not in FALLBACKS or any(t.data_ptr() % 16 for t in tensors[:3])
            or (torch.is_grad_enabled() and (q.requires_grad or k_cache.requires_grad or v_cache.requires_grad))):
        return _slow_paged(q, k_cache, v_cache, causal, scale, fallback, seq_lens, block_table, layout, mask)
    if hit[1] is None:
        return _sdpa_paged(q, k_cache, v_cache, causal, scale, seq_lens, block_table, mask)
    out = torch.empty_like(q)
    hit[1].paged(q, k_cache, v_cache, out, block_table, seq_lens, scale, check=False)
    return out


def _slow_paged(q: Any, k_cache: Any, v_cache: Any, causal: bool, scale: Optional[float], fallback: Optional[str],
                seq_lens: Any, block_table: Any, layout: tuple, mask: tuple) -> torch.Tensor:
    """Validate fully, choose the decode kernel (or SDPA) and remember the layout."""
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback must be None or 'sdpa', got {fallback!r}")
    if q.dim() != 4:
        raise AttentionInputError(f"q must have rank 4 [B, H, Sq, D] (got shape {tuple(q.shape)})")
    refuse_unscaled_fp8(q, k_cache, v_cache)
    check_paged_structure(q, k_cache, v_cache, block_table, seq_lens)
    try:
        check_paged_kernel_inputs(q, k_cache, v_cache, block_table, seq_lens)
        refuse_grads(q, k_cache, v_cache)
        kernel = choose_kernel(q, paged_key(q, k_cache, block_table, causal, mask))
    except (AttentionInputError, GpuUnavailableError):
        if fallback == "sdpa":
            return _sdpa_paged(q, k_cache, v_cache, causal, scale, seq_lens, block_table, mask)
        raise
    if kernel is not None and not kernel.shape.splits:
        kernel = None  # only the decode kernels read pages: SDPA on the gathered pages, as a routed cell does
    if len(_paged_cache) >= 256:  # a server's shapes vary: keep the cache bounded
        _paged_cache.clear()
    _paged_cache[layout] = (q.get_device(), kernel)
    if kernel is None:  # a cell routed to SDPA, or without a decode kernel
        return _sdpa_paged(q, k_cache, v_cache, causal, scale, seq_lens, block_table, mask)
    out = torch.empty_like(q)
    kernel.paged(q, k_cache, v_cache, out, block_table, seq_lens, scale, check=False)
    return out


def paged_key(q: Any, k_cache: Any, block_table: Any, causal: bool, mask: tuple = NO_MASK) -> Key:
    """The dispatch key of a paged call: Sk is the table's capacity, the page size the cache's (ranks the
    entries: a kernel tuned on pages of this size first), with per-row lengths."""
    b, h, sq, d = q.shape
    page, hkv = k_cache.shape[1], k_cache.shape[2]
    return Key.of(DTYPES[q.dtype], d, causal, h, hkv, sq, max(block_table.shape[1] * page, 1), batch=b, mask=mask,
                  page_size=page)


def check_paged_kernel_inputs(q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any) -> None:
    """The decode kernels' limits on a structurally sound paged call (beyond them the fallback may run)."""
    check_attention_tensors(q, q, q, q)
    check_paged_inputs(q, k_cache, v_cache, block_table, seq_lens)


def check_paged_structure(q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any) -> None:
    """What no implementation can compute, fallback or not: wrong cache shapes, table or lengths."""
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape or k_cache.shape[3] != q.shape[3]:
        raise AttentionInputError(f"k_cache and v_cache must be [pages, page_size, Hkv, D] with q's D (q "
                                  f"{tuple(q.shape)}, k_cache {tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)})")
    check_structure(q, k_cache.transpose(1, 2), v_cache.transpose(1, 2), paged=True)
    check_seq_lens(q, seq_lens)
    if (block_table.dtype != torch.int32 or block_table.dim() != 2 or block_table.shape[0] != q.shape[0]
            or block_table.device != q.device):
        raise AttentionInputError(f"block_table must be an int32 tensor of shape ({q.shape[0]}, pages_per_seq) on "
                                  f"{q.device}")


def gather_pages(cache: torch.Tensor, block_table: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The dense [B, Hkv, pages_per_seq * page_size, D] view of each row's pages (unused entries: page 0), copied
    into `out` ([B * pages_per_seq, page_size, Hkv, D]) when given. An FP8 cache's pages move as bytes (not every
    torch indexes float8 tensors)."""
    b, n = block_table.shape
    raw = cache.view(torch.uint8) if cache.element_size() == 1 else cache
    raw_out = out.view(torch.uint8) if out is not None and out.element_size() == 1 else out
    pages = torch.index_select(raw, 0, block_table.clamp(0, cache.shape[0] - 1).reshape(-1).long(), out=raw_out)
    _, page, hkv, d = cache.shape
    return pages.view(b, n * page, hkv, d).transpose(1, 2).view(cache.dtype)


def _sdpa_paged(q: Any, k_cache: Any, v_cache: Any, causal: bool, scale: Optional[float], seq_lens: Any,
                block_table: Any, mask: tuple) -> torch.Tensor:
    lens = seq_lens.clamp(max=block_table.shape[1] * k_cache.shape[1])  # as the kernels clamp
    return sdpa_with_lens(q, gather_pages(k_cache, block_table), gather_pages(v_cache, block_table), causal,
                          scale, lens, mask)
