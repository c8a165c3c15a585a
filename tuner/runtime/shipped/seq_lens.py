"""Per-sequence key lengths: one dense K/V cache of Sk slots, batch row b using its first seq_lens[b] keys.

Part of the runtime every export ships. The decode kernels read the lengths on the
GPU, so a CUDA graph captured once replays with new lengths (a static cache's decode step). Everything else
(no decode kernel for the shape, a cell routed to SDPA) runs torch SDPA under the equivalent boolean mask,
built on the GPU as well, so that path captures too.

Causal masking aligns to each row's own length: query i of Sq sees keys j < L and j <= L - Sq + i.
"""

from typing import Any, Optional

import torch

from .launcher import AttentionInputError


def check_seq_lens(q: Any, seq_lens: Any) -> None:
    """One-line error unless seq_lens is a contiguous int32 [B] tensor on q's device."""
    if not (isinstance(seq_lens, torch.Tensor) and seq_lens.dtype == torch.int32 and seq_lens.dim() == 1
            and seq_lens.numel() == q.shape[0] and seq_lens.is_contiguous() and seq_lens.device == q.device):
        got = (f"{seq_lens.dtype} {tuple(seq_lens.shape)} on {seq_lens.device}" if isinstance(seq_lens, torch.Tensor)
               else type(seq_lens).__name__)
        raise AttentionInputError(f"seq_lens must be a contiguous int32 tensor of shape ({q.shape[0]},) on "
                                  f"{q.device} (got {got})")


def lens_mask(seq_lens: torch.Tensor, sq: int, sk: int, causal: bool) -> torch.Tensor:
    """The boolean mask [B, 1, Sq, Sk] (True: attend) that seq_lens and causal stand for."""
    lens = seq_lens.view(-1, 1, 1, 1).long()
    cols = torch.arange(sk, device=seq_lens.device).view(1, 1, 1, sk)
    mask = cols < lens
    if causal:
        rows = torch.arange(sq, device=seq_lens.device).view(1, 1, sq, 1)
        mask = mask & (cols <= lens - sq + rows)
    return mask.expand(-1, 1, sq, sk)


def sdpa_with_lens(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: Optional[float],
                   seq_lens: torch.Tensor) -> torch.Tensor:
    """torch SDPA under lens_mask; a query that sees no key gives zeros, as the kernels do."""
    from torch.nn.functional import scaled_dot_product_attention

    mask = lens_mask(seq_lens, q.shape[-2], k.shape[-2], causal)
    gqa = q.shape[-3] != k.shape[-3]
    out = scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
    out = torch.where(mask.any(-1, keepdim=True), out, torch.zeros((), dtype=out.dtype, device=out.device))
    return torch.empty_like(q).copy_(out)  # the layout attention() promises (and its fake implementation)
