"""Hugging Face transformers integration: register_transformers() makes the tuned kernels an attention
implementation of transformers' attention interface.

Part of the runtime every export ships; transformers is optional and imported only when registering.

    import PACKAGE, transformers
    name = PACKAGE.register_transformers()
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=name)

Masks: the name is registered with its own mask function, a thin layer over transformers' SDPA one.
- A batch without padding reaches the attention as "no mask" (causal from the module): the tuned kernel.
- A causal mask that only says "the first L keys of the cache" (a static cache's decode steps, a short
  verify of up to 16 queries) arrives as per-row key lengths (int32 [B, 1, 1, 1], computed on the GPU, so
  the step captures in a CUDA graph): the decode kernels read them (attention(..., seq_lens=)). This needs
  the model called with no attention_mask, as a static-cache serving loop does; generate() passes an
  all-ones 2-D mask, which cannot be told from padding without a host sync, so its steps take SDPA.
  Both markers are 4-D int32 tensors (transformers builds bool or float masks): generate() with a static
  cache prepares the masks ahead and hands them back to the model, which takes only a 4-D mask as prepared.
- A sliding-window layer's mask (Mistral, Gemma-2/3, Qwen2 with use_sliding_window) without padding, whose
  queries end where its keys end (a prefill, a dynamic cache's decode step), arrives as a window marker
  (window_marker()); the window travels in the marker's shape, not in the `sliding_window` keyword, which some
  models do not pass (Qwen2-MoE, PhiMoE). transformers' window (masking_utils.sliding_window_overlay, 5.x, the
  same in 5.17 and 5.24): query q sees key j iff q - sliding_window < j <= q, i.e. window_size (sliding_window
  - 1, 0), what its FlashAttention path passes too. A window that cannot bind (no more keys than it spans) is
  dropped, so such calls run the kernels tuned without one.
- A `softcap` keyword (Gemma-2's attn_logit_softcapping) goes to the kernels of that softcap; where none
  serves the call, to the torch softcap implementation under the same mask (transformers' SDPA path has no
  softcap: 5.24 refuses it, 5.17 ignores it).
- Packed sequences (transformers' padding-free form, e.g. DataCollatorWithFlattening(return_flash_attn_kwargs=True)):
  one flattened row (B = 1) with the FlashAttention kwargs cu_seq_lens_q, cu_seq_lens_k, max_length_q and
  max_length_k (5.x, the same in 5.24) goes to attention_varlen (the packed kernels, else per-sequence SDPA), with
  the module's causality, a `sliding_window` keyword's or a window marker's window and the softcap. Its mask must say
  nothing the lengths do not: none (no cache-free packing detected, or a causal skip), a window marker, or, for a
  causal layer of a model without a sliding window or chunked attention (or with the `sliding_window` keyword), the
  4-D bool mask transformers builds from packed position_ids (the same sequences). With dropout, output_attentions
  or a position_bias the packed rows go to transformers' SDPA path under the block-diagonal mask of the lengths.
- Training (inputs requiring grad) without a mask, window or softcap goes to attention(), which runs the tuned
  forward and a backward on its O and lse where the cell has a tuned kernel (attention()'s docstring).
- Any other mask (padding, packed sequences without those kwargs, bidirectional or chunked windows), dropout, other
  training calls, a causal
  call with more queries than keys, or a shape the kernels cannot take go to transformers' own SDPA path with
  the mask transformers built (or the equivalent boolean mask of a window marker), so results are SDPA's
  wherever the kernel does not apply. Attention sinks (s_aux, sinks) are refused: neither path has them.
"""

from typing import Any, Optional

import torch

from .api import NO_WINDOW, attention
from .autograd import compiled_with_grad, needs_grad, serves
from .dispatch import NO_MASK
from .masked import keys_kept, softcap_attention
from .seq_lens import lens_mask
from .varlen import attention_varlen, packed_mask

DEFAULT_NAME = "tuned_attention"
MAX_LENS_QUERIES = 16  # the decode kernels' reach (their templates' max_seq_q)


def register_transformers(name: str = DEFAULT_NAME) -> str:
    """Register the kernels under `name` (attention and mask function); returns the name to pass as
    `attn_implementation`. Names containing "flash" are refused: transformers takes them for hub kernels."""
    if "flash" in name.lower():
        raise ValueError(f"attention implementation name {name!r} contains 'flash': transformers would take it "
                         "for a hub kernel request; choose another name")
    try:
        from transformers import AttentionInterface, AttentionMaskInterface
    except ImportError as exc:
        raise ImportError(f"register_transformers needs transformers (pip install transformers): {exc}") from None
    AttentionInterface.register(name, transformers_attention)
    AttentionMaskInterface.register(name, transformers_mask)
    return name


def transformers_mask(batch_size: int, q_length: int, kv_length: int, q_offset: Any = 0, kv_offset: Any = 0,
                      mask_function: Any = None, attention_mask: Optional[torch.Tensor] = None,
                      local_size: Optional[int] = None, allow_is_causal_skip: bool = True,
                      device: Any = "cpu", **kwargs: Any) -> Optional[torch.Tensor]:
    """transformers' mask interface: a window marker for a plain sliding-window layer, key lengths (int32 [B])
    for a plain causal prefix of the cache, else what transformers' SDPA mask function returns (None where
    is_causal suffices, or a boolean mask)."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    mask_function = causal_mask_function if mask_function is None else mask_function
    window = sliding_window_of(mask_function)
    # Bottom-right: the last query is the last key (q_offset + q_length == kv_offset + kv_length), ints only
    # (a static cache's tensor offset would need a host read, and its cache is not aligned so).
    aligned = (isinstance(q_offset, int) and isinstance(kv_offset, int)
               and q_offset + q_length == kv_offset + kv_length)
    if window is not None and window == local_size and attention_mask is None and aligned and allow_is_causal_skip:
        return window_marker(batch_size, window, device)
    prefix = (mask_function is causal_mask_function and attention_mask is None and local_size is None
              and kv_offset == 0 and q_length <= MAX_LENS_QUERIES)
    if not prefix or (allow_is_causal_skip and (q_length == 1 or kv_length == q_length)):
        return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                         kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
                         local_size=local_size, allow_is_causal_skip=allow_is_causal_skip, device=device, **kwargs)
    # Query i (absolute position q_offset + i) sees keys 0 .. q_offset + i: the first q_offset + q_length,
    # bottom-right aligned. q_offset is a GPU tensor for a static cache: no host sync, graph-safe.
    if isinstance(q_offset, torch.Tensor):
        lens = (q_offset.reshape(1) + q_length).to(device=device, dtype=torch.int32).expand(batch_size).contiguous()
    else:
        lens = torch.full((batch_size,), int(q_offset) + q_length, dtype=torch.int32, device=device)
    return lens.view(batch_size, 1, 1, 1)


def _lens_of(mask: Any) -> Optional[torch.Tensor]:
    """The key lengths (int32 [B]) of a lengths marker of transformers_mask, else None."""
    if (isinstance(mask, torch.Tensor) and mask.dtype == torch.int32 and mask.dim() == 4
            and tuple(mask.shape[1:]) == (1, 1, 1)):
        return mask.reshape(-1)
    return None


def sliding_window_of(mask_function: Any) -> Optional[int]:
    """W when mask_function is transformers' sliding_window_causal_mask_function(W) (and_masks of
    sliding_window_overlay(W) and causal_mask_function), read from the closures; None for anything else (an
    extra or_mask / and_mask, a chunked or bidirectional window, another transformers version's shape)."""
    from transformers.masking_utils import causal_mask_function

    if getattr(mask_function, "__qualname__", "") != "and_masks.<locals>.and_mask":
        return None
    parts = _closure_value(mask_function, "mask_functions")
    if not (isinstance(parts, tuple) and len(parts) == 2 and parts[1] is causal_mask_function):
        return None
    if getattr(parts[0], "__qualname__", "") != "sliding_window_overlay.<locals>.inner_mask":
        return None
    window = _closure_value(parts[0], "sliding_window")
    return window if type(window) is int and window >= 1 else None


def _closure_value(function: Any, name: str) -> Any:
    code, cells = getattr(function, "__code__", None), getattr(function, "__closure__", None)
    if code is None or not cells or name not in code.co_freevars:
        return None
    return cells[code.co_freevars.index(name)].cell_contents


def window_marker(batch_size: int, sliding_window: int, device: Any) -> torch.Tensor:
    """The mask standing for "causal, each query sees its last `sliding_window` keys, no padding": an empty
    int32 [B, 1, 0, sliding_window] (no query row, no memory), the window in its shape (read on the host without
    a sync, static under torch.compile). Only transformers_attention reads it."""
    return torch.empty((batch_size, 1, 0, sliding_window), dtype=torch.int32, device=device)


def _is_window_marker(mask: Any) -> bool:
    return isinstance(mask, torch.Tensor) and mask.dtype == torch.int32 and mask.dim() == 4 and mask.shape[2] == 0


def transformers_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask: Optional[torch.Tensor], dropout: float = 0.0,
                           scaling: Optional[float] = None, is_causal: Optional[bool] = None,
                           **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: q [B, H, Sq, D], k/v [B, Hkv, Sk, D]; returns ([B, Sq, H, D], None)."""
    if kwargs.get("s_aux") is not None or kwargs.get("sinks") is not None:
        raise ValueError("attention sinks (s_aux / sinks) are not supported by the tuned kernels nor their SDPA "
                         "fallback; use attn_implementation='eager' for this model")
    softcap = float(kwargs.pop("softcap", None) or 0.0)
    told_window = "sliding_window" in kwargs  # the model names its layer's window (None: none)
    sliding = kwargs.pop("sliding_window", None)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    packed = _packed_kwargs(module, query, key, attention_mask, bool(causal), told_window, kwargs)
    if packed is not None:
        return _attention_packed(module, query, key, value, attention_mask, packed, dropout, scaling, bool(causal),
                                 sliding, softcap, kwargs)
    causal = bool(causal) and query.shape[2] > 1
    marker, left, lens = _is_window_marker(attention_mask), -1, _lens_of(attention_mask)
    if marker:  # causal and bottom-right by construction (transformers_mask)
        left, attention_mask, causal = attention_mask.shape[3] - 1, None, query.shape[2] > 1
    elif lens is not None:  # key lengths from transformers_mask
        return _attention_with_lens(module, query, key, value, lens, dropout, scaling, softcap, kwargs)
    elif attention_mask is None:
        if causal and key.shape[2] > query.shape[2]:
            # Prefill into an empty static cache: transformers' causal is top-left here, which is the first
            # Sq keys (what its SDPA path slices too); the view keeps the kernel's bottom-right rule exact.
            key, value = key[:, :, :query.shape[2]], value[:, :, :query.shape[2]]
        if sliding and (causal or query.shape[2] == 1):
            left = int(sliding) - 1  # no mask: the keyword is the window, as transformers' FlashAttention path reads it
    if key.shape[2] <= left + 1:
        left = -1  # no key lies beyond the window: the same computation without it
    grads = needs_grad(query, key, value) and not _trains(query, key, value, causal, left, softcap)
    if (attention_mask is not None or dropout or grads or kwargs.get("position_bias") is not None
            or kwargs.get("output_attentions") or (causal and not marker and query.shape[2] != key.shape[2])):
        if marker or left >= 0:  # the mask transformers would have built: bottom-right, causal, the window
            attention_mask = keys_kept(query.shape[2], key.shape[2], True, (left, -1), query.device)
        return _sdpa_path(module, query, key, value, attention_mask, dropout, scaling, is_causal, softcap, kwargs)
    # No window: attention()'s own default, whose keyword checks a plain call skips (host time per layer).
    window = (left, -1) if left >= 0 else NO_WINDOW
    out = attention(query, key, value, causal=causal, scale=scaling, fallback="sdpa", window_size=window,
                    softcap=softcap)
    return out.transpose(1, 2).contiguous(), None


def _trains(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, causal: bool, left: int,
            softcap: float) -> bool:
    """Whether attention() serves a training call (inputs requiring grad) by the tuned forward and a backward on its
    O and lse (autograd.py): no window, no softcap, a cell with a tuned kernel; under torch.compile, the
    differentiable op's form."""
    if left >= 0 or softcap:
        return False
    if torch.compiler.is_compiling():
        return compiled_with_grad(query, key, value, NO_MASK, True)
    return serves(query, key, value, causal)


def _sdpa_path(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               mask: Optional[torch.Tensor], dropout: float, scaling: Optional[float], is_causal: Optional[bool],
               softcap: float, kwargs: dict[str, Any]) -> tuple[torch.Tensor, None]:
    """transformers' SDPA path with `mask`; with a softcap (which it has not) the torch softcap implementation."""
    if not softcap:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    if kwargs.get("position_bias") is not None:
        raise ValueError("a position_bias with a softcap is not supported by the tuned attention; use 'eager'")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if mask is None and causal and query.shape[2] > 1:  # top-left, as transformers' SDPA path reads is_causal
        mask = torch.ones(query.shape[2], key.shape[2], dtype=torch.bool, device=query.device).tril()
    out = softcap_attention(query, key, value, scaling, softcap,
                            lambda r0, r1: None if mask is None else mask[..., r0:r1, :], dropout=dropout)
    return out.transpose(1, 2).contiguous(), None


def _attention_with_lens(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         seq_lens: torch.Tensor, dropout: float, scaling: Optional[float], softcap: float,
                         kwargs: dict[str, Any]) -> tuple[torch.Tensor, None]:
    """Causal attention over each row's first seq_lens[b] keys: the decode kernels, else masked SDPA."""
    if dropout or kwargs.get("position_bias") is not None or kwargs.get("output_attentions"):
        mask = lens_mask(seq_lens, query.shape[2], key.shape[2], causal=True)
        return _sdpa_path(module, query, key, value, mask, dropout, scaling, False, softcap, kwargs)
    out = attention(query, key, value, causal=True, scale=scaling, fallback="sdpa", seq_lens=seq_lens,
                    softcap=softcap)
    return out.transpose(1, 2).contiguous(), None


VARLEN_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")  # FlashAttentionKwargs (5.x)


def _packed_kwargs(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, mask: Any, causal: bool,
                   told_window: bool, kwargs: dict[str, Any]) -> Optional[tuple]:
    """(cu_seqlens_q, cu_seqlens_k) int32 on the queries' device and (max_seqlen_q, max_seqlen_k) ints where
    transformers passed packed sequences' FlashAttention kwargs for one flattened row whose mask says nothing more
    (see the module's docstring), else None. A max_length tensor is read on the host; cu_seq_lens are cast and moved
    as needed (the collator's are int32 on the CPU)."""
    values = [kwargs.get(name) for name in VARLEN_KWARGS]
    if any(x is None for x in values) or query.shape[0] != 1:
        return None
    config = getattr(module, "config", None)
    plain = not getattr(config, "attention_chunk_size", None) and (told_window
                                                                    or not getattr(config, "sliding_window", None))
    if not (mask is None or _is_window_marker(mask)
            or (causal and plain and isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and mask.dim() == 4
                and tuple(mask.shape[-2:]) == (query.shape[2], key.shape[2]))):
        return None
    cu_q, cu_k = (torch.as_tensor(c).to(device=query.device, dtype=torch.int32) for c in values[:2])
    return (cu_q, cu_k), tuple(int(m) for m in values[2:])


def _attention_packed(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      mask: Any, packed: tuple, dropout: float, scaling: Optional[float], causal: bool,
                      sliding: Optional[int], softcap: float, kwargs: dict[str, Any]) -> tuple[torch.Tensor, None]:
    """One flattened row of packed sequences ([1, H, total, D]) through attention_varlen; returns ([1, total, H, D],
    None). The window: the `sliding_window` keyword's (W - 1, W - 1; causal: (W - 1, -1)), else a window marker's
    (W - 1, -1), as transformers' FlashAttention path reads them; with dropout, output_attentions or a position_bias transformers' SDPA path
    runs under the lengths' block-diagonal mask."""
    (cu_q, cu_k), (max_q, max_k) = packed
    for name in VARLEN_KWARGS:
        kwargs.pop(name, None)
    left = int(sliding) - 1 if sliding else mask.shape[3] - 1 if _is_window_marker(mask) else -1
    # transformers' FlashAttention path: window_size (W - 1, W - 1), its right bound moot when causal
    window = (left, -1 if causal else left) if left >= 0 else NO_WINDOW
    if dropout or kwargs.get("position_bias") is not None or kwargs.get("output_attentions"):
        block = packed_mask(cu_q, cu_k, query.shape[2], key.shape[2], causal, window)
        return _sdpa_path(module, query, key, value, block, dropout, scaling, False, softcap, kwargs)
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [total, heads, D] views
    out = attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal, scale=scaling, window_size=window,
                           softcap=softcap, fallback="sdpa")
    return out.unsqueeze(0).contiguous(), None
