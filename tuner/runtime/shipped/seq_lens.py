"""Per-sequence key lengths: one dense K/V cache of Sk slots, batch row b using its first seq_lens[b] keys.

Part of the runtime every export ships. The decode kernels read the lengths on the
GPU, so a CUDA graph captured once replays with new lengths (a static cache's decode step). Everything else
(no decode kernel for the shape, a cell routed to SDPA) runs torch SDPA under the equivalent boolean mask,
built on the GPU as well, so that path captures too.

Causal masking aligns to each row's own length: query i of Sq sees keys j < L and j <= L - Sq + i (a window
aligns the same way: L - Sq + i - left <= j <= L - Sq + i + right).
"""

from typing import Any, Optional

import torch

from .dispatch import NO_MASK
from .launcher import AttentionInputError
from .masked import fallback, keys_kept


def check_seq_lens(q: Any, seq_lens: Any) -> None:
    """One-line error unless seq_lens is a contiguous int32 [B] tensor on q's device."""
    if not (isinstance(seq_lens, torch.Tensor) and seq_lens.dtype == torch.int32 and seq_lens.dim() == 1
            and seq_lens.numel() == q.shape[0] and seq_lens.is_contiguous() and seq_lens.device == q.device):
        got = (f"{seq_lens.dtype} {tuple(seq_lens.shape)} on {seq_lens.device}" if isinstance(seq_lens, torch.Tensor)
               else type(seq_lens).__name__)
        raise AttentionInputError(f"seq_lens must be a contiguous int32 tensor of shape ({q.shape[0]},) on "
                                  f"{q.device} (got {got})")


def lens_mask(seq_lens: torch.Tensor, sq: int, sk: int, causal: bool, window: tuple = (-1, -1)) -> torch.Tensor:
    """The boolean mask [B, 1, Sq, Sk] (True: attend) that seq_lens, causal and a window (left, right) stand for."""
    return keys_kept(sq, sk, causal, window, seq_lens.device, seq_lens)


def sdpa_with_lens(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: Optional[float],
                   seq_lens: torch.Tensor, mask: tuple = NO_MASK) -> torch.Tensor:
    """torch SDPA under lens_mask (with a softcap: the torch softcap implementation, masked.fallback); a query
    that sees no key gives zeros, as the kernels do. `mask` is the call's (window_left, window_right, softcap)."""
    return fallback(q, k, v, causal, scale, mask, lens=seq_lens)
