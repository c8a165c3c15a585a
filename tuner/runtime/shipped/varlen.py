"""attention_varlen: packed sequences (FlashAttention's varlen form) on the package's packed kernels, else per-sequence
torch SDPA.

Part of the runtime every export ships (this folder, copied whole). Sequences lie one after another: q [total_q, H, D],
k and v [total_k, Hkv, D]; sequence b is rows cu_seqlens_q[b] .. cu_seqlens_q[b+1] - 1 of q with keys
cu_seqlens_k[b] .. cu_seqlens_k[b+1] - 1 of k and v. Semantics, flash_attn_varlen_func's forward: causal masking and
windows align each sequence's queries to its own keys' end (bottom-right), softcap caps its scores; a query that sees
no key gives zeros. A packed kernel is its own compiled variant (entry parameters of its own), so a packed call
chooses only among the export's packed entries (the dispatch key's Sq and Sk buckets from max_seqlen_q and
max_seqlen_k, its batch the number of sequences) and a dense call never runs one.
Where no packed kernel serves a call (none tuned for it, fallback="sdpa" with inputs the kernels cannot take, a
kernel that does not load on this card, a cell routed to SDPA) each sequence runs torch SDPA (a window or softcap:
masked.fallback) on its slice; that path reads cu_seqlens on the host (one sync) and checks them.
"""
# No `from __future__ import annotations`: torch.library reads the op's schema from real annotations.

from typing import Any, Optional

import torch

from . import kernels as _kernels, masked as _masked
from .api import NO_WINDOW, PACKAGE  # PACKAGE: the op namespace, the package's import name
from .choice import DTYPES, FALLBACKS, choose_kernel, refuse_grads, table
from .dispatch import NO_MASK, Explanation, Key, mask_text
from .input_checks import check_packed_inputs, check_packed_structure
from .launcher import AttentionInputError, GpuUnavailableError

# (dtype, D, causal, H // Hkv, Sq bucket, Sk bucket, B x H bucket, mask, device) -> the packed kernel, or None (SDPA)
_cache: dict[tuple, Any] = {}


def attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, *, causal: bool = False,
                     scale: Optional[float] = None, window_size: Any = NO_WINDOW, softcap: Optional[float] = 0.0,
                     fallback: Optional[str] = None) -> torch.Tensor:
    """flash_attn_varlen_func's forward: q [total_q, H, D], k and v [total_k, Hkv, D] (float16 or bfloat16, CUDA,
    H % Hkv == 0), cu_seqlens_q / cu_seqlens_k int32 [B + 1] on q's device (cumulative lengths, cu[0] = 0),
    max_seqlen_q / max_seqlen_k ints at least every sequence's length. Returns out [total_q, H, D] in q's dtype
    (rows in no sequence: unspecified, zeros on the fallback).

    causal aligns each sequence bottom-right (its last query sees its last key); window_size (left, right) and
    softcap as attention() takes them; scale defaults to 1/sqrt(D). A call runs a packed kernel of its dtype, head
    dim, causality, window and softcap; fallback="sdpa" sends what no packed kernel takes (no such kernel, CPU
    tensors, gradients) to per-sequence torch SDPA instead of raising AttentionInputError. The kernels do not read
    cu_seqlens on the host: lengths past total or past max_seqlen are the caller's to avoid (the fallback checks them).
    """
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        raise AttentionInputError(f"q, k and v must be torch.Tensors (got {type(q).__name__}, {type(k).__name__}, "
                                  f"{type(v).__name__})")
    causal, mask = _masked.causal_form(causal, _masked.call_mask(window_size, softcap, causal))
    if torch.compiler.is_compiling():
        return _op(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, fallback, *mask)
    return _forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, fallback, mask)


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor, max_q: int,
             max_k: int, causal: bool, scale: Optional[float], fallback: Optional[str], mask: tuple) -> torch.Tensor:
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback must be None or 'sdpa', got {fallback!r}")
    check_packed_structure(q, k, v, cu_q, cu_k, max_q, max_k)  # what nothing computes: raises with the fallback too
    try:
        kernel = _resolve(q, k, v, cu_q, cu_k, max_q, max_k, causal, mask)
    except (AttentionInputError, GpuUnavailableError):
        if fallback == "sdpa":
            return packed_fallback(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, mask)
        raise
    if kernel is None:  # an entry routed to SDPA: its kernel measured slower there
        return packed_fallback(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, mask)
    out = torch.empty_like(q)
    kernel.packed(q, k, v, out, cu_q, cu_k, max_q, max_k, scale, check=False)  # checked in _resolve
    return out


def _resolve(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor, max_q: int,
             max_k: int, causal: bool, mask: tuple) -> Any:
    """Check the call as the packed kernels take it and choose its kernel (remembered per cell and device): an
    AttentionKernel, or None for an entry routed to SDPA. A kernel that cannot load on this card (its compute
    capability, shared memory, no nvcc for a JIT compile) raises GpuUnavailableError, which fallback="sdpa" takes."""
    check_packed_inputs(q, k, v, q, cu_q, cu_k, max_q, max_k)  # q stands in for out: empty_like(q) has its layout
    refuse_grads(q, k, v)
    device = q.get_device()
    cell = (q.dtype, q.shape[2], causal, q.shape[1] // k.shape[1], (max_q - 1).bit_length(),
            (max_k - 1).bit_length(), ((cu_q.numel() - 1) * q.shape[1] - 1).bit_length(), mask, device)
    if cell in _cache:
        return _cache[cell]
    kernel = choose_kernel(q, call_key(q, k, cu_q, max_q, max_k, causal, mask))
    _cache[cell] = kernel
    return kernel


def call_key(q: Any, k: Any, cu_q: Any, max_q: int, max_k: int, causal: bool, mask: tuple) -> Key:
    """The dispatch key of a packed call: buckets of the longest sequence's queries and keys, B = numel - 1."""
    return Key.of(DTYPES[q.dtype], q.shape[2], causal, q.shape[1], k.shape[1], max_q, max_k,
                  batch=cu_q.numel() - 1, mask=mask, packed=True)


def check_lengths(cq: list[int], ck: list[int], total_q: int, total_k: int, max_q: int, max_k: int) -> None:
    """The cumulative lengths as read on the host (the fallback's): from 0 or more, non-decreasing, within the
    tensors' totals, no sequence longer than its max_seqlen."""
    for name, cu, total, most in (("cu_seqlens_q", cq, total_q, max_q), ("cu_seqlens_k", ck, total_k, max_k)):
        if cu[0] < 0 or cu[-1] > total:
            raise AttentionInputError(f"{name} must lie within 0 .. {total} (the tensor's rows); got {cu[0]} .. "
                                      f"{cu[-1]}")
        lengths = [b - a for a, b in zip(cu, cu[1:])]
        if min(lengths) < 0:
            raise AttentionInputError(f"{name} must be non-decreasing (sequence {lengths.index(min(lengths))} has "
                                      f"length {min(lengths)})")
        if max(lengths) > most:
            raise AttentionInputError(f"{name}: sequence {lengths.index(max(lengths))} has {max(lengths)} rows, more "
                                      f"than max_seqlen {most}")


def packed_fallback(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
                    max_q: int, max_k: int, causal: bool, scale: Optional[float], mask: tuple) -> torch.Tensor:
    """The call without a kernel: each sequence's slices through attention()'s fallback (SDPA, bottom-right causal;
    a window or softcap: masked.fallback), as [1, H, L, D] views. One host read of the cumulative lengths."""
    bounds = torch.stack((cu_q, cu_k)).tolist()
    cq, ck = bounds[0], bounds[1]
    check_lengths(cq, ck, q.shape[0], k.shape[0], max_q, max_k)
    out = torch.zeros_like(q)  # rows in no sequence, and queries that see no key: zeros
    for b in range(len(cq) - 1):
        (q0, q1), (k0, k1) = cq[b:b + 2], ck[b:b + 2]
        if q1 == q0 or k1 == k0:
            continue
        qb, kb, vb = (t[r0:r1].transpose(0, 1).unsqueeze(0) for t, r0, r1 in ((q, q0, q1), (k, k0, k1), (v, k0, k1)))
        # fallback_call gives zeros where a query sees no key (causal, more queries than keys), as the kernels do.
        out[q0:q1] = _masked.fallback_call(qb, kb, vb, causal, scale, mask)[0].transpose(0, 1)
    return out


def packed_mask(cu_q: torch.Tensor, cu_k: torch.Tensor, total_q: int, total_k: int, causal: bool,
                window: tuple = NO_WINDOW) -> torch.Tensor:
    """Bool [1, 1, total_q, total_k] (True: attend): query i of sequence b sees key j of the same sequence, bottom-right
    causal and windowed within it (for paths that take one mask over the packed rows: SDPA with dropout). Built on
    the device, no host read; rows in no sequence see nothing."""
    def seq_of(cu: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = torch.arange(total, device=cu.device)
        seq = torch.searchsorted(cu[1:].long(), rows, right=True).clamp(max=cu.numel() - 2)
        start, end = cu.long()[seq], cu.long()[seq + 1]
        inside = (rows >= start) & (rows < end)
        return torch.where(inside, seq, -1 - (rows >= end).long()), rows - start, end - start

    sq_seq, q_pos, q_len = seq_of(cu_q, total_q)
    sk_seq, k_pos, _ = seq_of(cu_k, total_k)
    k_len = (cu_k[1:] - cu_k[:-1]).long()[sq_seq.clamp(min=0)]
    aligned = (q_pos + k_len - q_len).view(-1, 1)  # each query's position among its own sequence's keys
    kept = (sq_seq.view(-1, 1) == sk_seq.view(1, -1)) & (sq_seq.view(-1, 1) >= 0)
    if causal:
        kept = kept & (k_pos.view(1, -1) <= aligned)
    if window[0] >= 0:
        kept = kept & (k_pos.view(1, -1) >= aligned - window[0])
    if window[1] >= 0:
        kept = kept & (k_pos.view(1, -1) <= aligned + window[1])
    return kept.view(1, 1, total_q, total_k)


@torch.library.custom_op(f"{PACKAGE}::attention_varlen", mutates_args=())
def _op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
        max_seqlen_q: int, max_seqlen_k: int, causal: bool, scale: Optional[float], fallback: Optional[str],
        window_left: int = -1, window_right: int = -1, softcap: float = 0.0) -> torch.Tensor:
    return _forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, fallback,
                    (window_left, window_right, softcap))


@torch.library.register_fake(f"{PACKAGE}::attention_varlen")
def _op_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
             cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool, scale: Optional[float],
             fallback: Optional[str], window_left: int = -1, window_right: int = -1,
             softcap: float = 0.0) -> torch.Tensor:
    return torch.empty_like(q)


def explain_varlen(q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, max_seqlen_q: Any,
                   max_seqlen_k: Any, *, causal: bool = False, window_size: Any = NO_WINDOW,
                   softcap: Optional[float] = 0.0) -> Explanation:
    """Which kernel attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=...,
    window_size=..., softcap=...) would run, and why (print() it). Needs no GPU."""
    from .api import _choice_lines, _device_cc  # explain()'s wording of a choice

    errors, mask, key, choice = [], NO_MASK, None, None
    try:
        causal, mask = _masked.causal_form(causal, _masked.call_mask(window_size, softcap, causal))
    except AttentionInputError as exc:
        errors.append(str(exc))
    try:
        check_packed_structure(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
        if q.dtype in DTYPES:
            key = call_key(q, k, cu_seqlens_q, max_seqlen_q, max_seqlen_k, causal, mask)
        check_packed_inputs(q, k, v, q, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    except AttentionInputError as exc:
        errors.append(str(exc))
    sequences = cu_seqlens_q.numel() - 1 if isinstance(cu_seqlens_q, torch.Tensor) else "?"
    shapes = (f"q {tuple(getattr(q, 'shape', ()))}, k {tuple(getattr(k, 'shape', ()))}, v "
              f"{tuple(getattr(v, 'shape', ()))}, {getattr(q, 'dtype', '?')}, {sequences} sequences, max_seqlen_q="
              f"{max_seqlen_q!r}, max_seqlen_k={max_seqlen_k!r}, causal={bool(causal)}"
              + ("" if mask == NO_MASK else f", {mask_text(mask)}"))
    lines, code = [f"{PACKAGE}.attention_varlen({shapes})"], "none"
    if key is not None:
        lines.append(f"  dispatch key: {key.label()}")
        choice = table().choose(key)
        if choice is None:
            errors.append(table().unsupported_reason(key))
        else:
            code = _kernels.code_source(choice.entry["kernel"], _device_cc(q))
            lines += _choice_lines(choice, mask) + [f"  code: {code}"]
            if choice.route == "sdpa":
                lines.append("  routed: each sequence runs the fallback below")
    error = "; ".join(errors) or None
    fallback = f"per-sequence {_masked.fallback_name(mask)}"
    if error:
        lines.append(f"  error: {error} (fallback='sdpa' would run {fallback} instead)")
    return Explanation(choice.entry["kernel"] if choice else None, choice.entry["trial_id"] if choice else None,
                       bool(choice and choice.exact), choice.reason if choice else (error or ""), code, error,
                       "\n".join(lines))


attention_varlen.explain = explain_varlen  # type: ignore[attr-defined]
