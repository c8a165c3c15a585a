"""Sliding windows and logit softcapping in a call: the keywords' rules, and what runs where no tuned kernel has them.

Part of the runtime every export ships (this folder, copied whole). A kernel compiles its window and softcap in,
so a call runs a kernel only of its own (window, softcap), prefill or decode; elsewhere (fallback="sdpa", a cell
routed to SDPA, a shape with no kernel of that window and softcap) a window runs torch SDPA under an explicit
boolean mask, and a softcap runs a plain torch implementation (SDPA has no softcap): scores, tanh, softmax, @ v,
a chunk of query rows at a time so that long sequences fit.

Semantics, FlashAttention's: query i, aligned to the keys' end (i' = i + L - Sq, L the keys in use), sees key j
iff i' - left <= j <= i' + right (-1 unbounded; causal is right = 0); scores = q k^T * scale become
softcap * tanh(scores / softcap). A query that sees no key gives zeros, as the kernels do.
"""

from typing import Any, Callable, Optional

import torch

from .dispatch import NO_MASK
from .launcher import AttentionInputError

CHUNK_SCORES = 1 << 24  # fp32 scores per chunk of the softcap path (64 MiB; a few such buffers live at once)
_MAX_EXTENT = 2**31 - 1


def call_mask(window_size: Any, softcap: Any, causal: bool) -> tuple[int, int, float]:
    """The (window_left, window_right, softcap) a call asks for, spelt as the kernels and Problem spell it:
    None is an unbounded side (as FlashAttention takes it), causal's right bound is -1, softcap 0 or None is off.
    A one-line AttentionInputError for anything else."""
    if window_size is None:
        window_size = (-1, -1)
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise AttentionInputError(f"window_size must be (left, right), got {window_size!r}") from None
    sides = [-1 if side is None else side for side in (left, right)]
    for name, side in zip(("left", "right"), sides):
        if isinstance(side, bool) or not isinstance(side, int) or not -1 <= side <= _MAX_EXTENT:
            raise AttentionInputError(f"window_size {name} must be an integer >= -1 (-1 or None: unbounded), "
                                      f"got {side!r}")
    if causal and sides[1] > 0:
        raise AttentionInputError(f"a causal call sees no key right of its query: window_size right must be 0, -1 or "
                                  f"None, got {sides[1]} (FlashAttention ignores it; pass ({sides[0]}, 0))")
    if causal:
        sides[1] = -1
    cap = 0.0 if softcap is None else softcap
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not 0 <= cap < float("inf"):
        raise AttentionInputError(f"softcap must be 0 or None (off) or a positive finite number, got {softcap!r}")
    return (sides[0], sides[1], float(cap))


def causal_form(causal: bool, mask: tuple) -> tuple[bool, tuple]:
    """A right bound of 0 is causality (FlashAttention folds it the same way): (causal, mask) with one
    spelling, causal and right -1, so (L, 0) finds the kernels tuned as causal with window L."""
    if mask[1] == 0:
        return True, (mask[0], -1, mask[2])
    return bool(causal), mask


def fallback_name(mask: tuple) -> str:
    """What runs a call of this mask where no tuned kernel does (explain() names it)."""
    if mask[2]:
        return "the torch softcap implementation (SDPA has no softcap: scores, tanh, softmax, @ v in chunks)"
    if mask[:2] != NO_MASK[:2]:
        return "torch SDPA with a boolean window mask"
    return "torch SDPA"


def keys_kept(sq: int, sk: int, causal: bool, window: tuple, device: Any, lens: Optional[torch.Tensor] = None,
              rows: Optional[tuple[int, int]] = None) -> Optional[torch.Tensor]:
    """Bool [B or 1, 1, rows, Sk] (True: attend) for query rows r0:r1 (all by default); None where every key is
    seen (no lens, no causality, no window). With lens (int [B]) row b uses its first lens[b] keys and aligns to
    that length."""
    r0, r1 = rows if rows is not None else (0, sq)
    left, right = window[0], window[1]
    if lens is None and not causal and left < 0 and right < 0:
        return None
    end = lens.view(-1, 1, 1, 1).long().clamp(0, sk) if lens is not None else sk  # the keys in use, as kernels clamp
    cols = torch.arange(sk, device=device).view(1, 1, 1, sk)
    pos = torch.arange(r0, r1, device=device).view(1, 1, -1, 1) + (end - sq)  # each query's aligned position
    kept = cols < end if lens is not None else torch.ones((1, 1, 1, 1), dtype=torch.bool, device=device)
    if causal:
        kept = kept & (cols <= pos)
    if left >= 0:
        kept = kept & (cols >= pos - left)
    if right >= 0:
        kept = kept & (cols <= pos + right)
    return kept.expand(-1, 1, r1 - r0, sk)


def fallback(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: Optional[float], mask: tuple,
             lens: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The call without a kernel: the softcap implementation, else SDPA under the window's (and lens') mask."""
    sq, sk, window = q.shape[-2], k.shape[-2], mask[:2]
    if mask[2]:
        out = softcap_attention(q, k, v, scale, mask[2],
                                lambda r0, r1: keys_kept(sq, sk, causal, window, q.device, lens, (r0, r1)))
        return torch.empty_like(q).copy_(out)
    from torch.nn.functional import scaled_dot_product_attention

    kept = keys_kept(sq, sk, causal, window, q.device, lens)
    gqa = q.shape[-3] != k.shape[-3]
    out = scaled_dot_product_attention(q, k, v, attn_mask=kept, scale=scale, enable_gqa=gqa)
    if kept is not None:  # a row that sees no key: zeros, as the kernels give (SDPA gives NaN there)
        out = torch.where(kept.any(-1, keepdim=True), out, torch.zeros((), dtype=out.dtype, device=out.device))
    return torch.empty_like(q).copy_(out)  # the layout attention() promises (and its fake implementation)


def fallback_call(q: Any, k: Any, v: Any, causal: bool, scale: Optional[float], mask: tuple) -> torch.Tensor:
    """What runs a call no kernel serves: SDPA, or for a window or softcap masked.fallback."""
    if mask == NO_MASK and not (causal and q.shape[-2] > k.shape[-2]):
        return sdpa(q, k, v, causal, scale)
    # More queries than keys, causal: the first queries see no key. SDPA's lower-right bias may give NaN there
    # (torch warns so); the masked path gives zeros, as the kernels do.
    return fallback(q, k, v, causal, scale, mask)


def sdpa(q: Any, k: Any, v: Any, causal: bool, scale: Optional[float]) -> torch.Tensor:
    """torch SDPA with the kernels' semantics: bottom-right causal alignment, GQA."""
    from torch.nn.functional import scaled_dot_product_attention

    mask, is_causal = None, False
    if causal:
        sq, sk = q.shape[-2], k.shape[-2]
        if sq == sk:
            is_causal = True
        else:
            from torch.nn.attention.bias import causal_lower_right

            mask = causal_lower_right(sq, sk)
    gqa = q.dim() >= 3 and k.dim() >= 3 and q.shape[-3] != k.shape[-3]
    out = scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=gqa)
    if isinstance(q, torch.Tensor) and out.shape == q.shape and out.stride() != torch.empty_like(q).stride():
        out = torch.empty_like(q).copy_(out)  # the layout the fake implementation promises torch.compile
    return out


def softcap_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: Optional[float], softcap: float,
                      mask_rows: Callable[[int, int], Optional[torch.Tensor]], dropout: float = 0.0) -> torch.Tensor:
    """softmax(softcap * tanh(q k^T * scale / softcap) under a mask) v in fp32, a chunk of query rows at a time.

    q [B, H, Sq, D], k and v [B, Hkv, Sk, D] (GQA); mask_rows(r0, r1) gives the mask of query rows r0:r1
    (None, bool True = attend, or additive float) broadcastable to [B, H, r1 - r0, Sk]. Differentiable;
    returns [B, H, Sq, D] in q's dtype."""
    b, h, sq, d = q.shape
    hkv, sk = k.shape[-3], k.shape[-2]
    group = h // hkv
    scale = d ** -0.5 if scale is None else scale
    kf, vf = k.float().unsqueeze(2), v.float().unsqueeze(2)  # [B, Hkv, 1, Sk, D]: each K/V head serves its group
    step = max(1, CHUNK_SCORES // max(1, b * h * sk))
    chunks = []
    for r0 in range(0, sq, step):
        r1 = min(sq, r0 + step)
        qc = q[:, :, r0:r1].float().reshape(b, hkv, group, r1 - r0, d)
        scores = torch.tanh(torch.matmul(qc, kf.transpose(-1, -2)) * (scale / softcap)) * softcap
        scores = scores.reshape(b, h, r1 - r0, sk)
        mask = mask_rows(r0, r1)
        if mask is not None and mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        elif mask is not None:
            scores = scores + mask
        probs = torch.softmax(scores, dim=-1)
        if mask is not None and mask.dtype == torch.bool:  # no key seen: zeros, not NaN
            probs = torch.where(mask.any(-1, keepdim=True), probs, torch.zeros((), device=probs.device))
        if dropout:
            probs = torch.nn.functional.dropout(probs, p=dropout)
        chunks.append(torch.matmul(probs.reshape(b, hkv, group, r1 - r0, sk), vf).reshape(b, h, r1 - r0, d))
    if not chunks:  # no query rows
        return q.new_empty(b, h, 0, d)
    return torch.cat(chunks, dim=2).to(q.dtype)
