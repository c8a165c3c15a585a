"""Hugging Face transformers integration: register_transformers() makes the tuned kernels an attention
implementation of transformers' attention interface.

Part of the runtime every export ships; transformers is optional and imported only when registering.

    import PACKAGE, transformers
    name = PACKAGE.register_transformers()
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=name)

Masks: the name is registered with its own mask function, a thin layer over transformers' SDPA one.
- A batch without padding reaches the attention as "no mask" (causal from the module): the tuned kernel.
- A causal mask that only says "the first L keys of the cache" (a static cache's decode steps, a short
  verify of up to 16 queries) arrives as per-row key lengths (int32 [B], computed on the GPU, so the
  step captures in a CUDA graph): the decode kernels read them (attention(..., seq_lens=)). This needs
  the model called with no attention_mask, as a static-cache serving loop does; generate() passes an
  all-ones 2-D mask, which cannot be told from padding without a host sync, so its steps take SDPA.
- Any other mask (padding, sliding window, packed sequences), dropout, gradients, a causal call with more
  queries than keys, or a shape the kernels cannot take go to transformers' own SDPA path, so results
  are SDPA's wherever the kernel does not apply.
"""

from typing import Any, Optional

import torch

from .api import attention
from .seq_lens import lens_mask

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


def transformers_mask(batch_size: int, q_length: int, kv_length: int, q_offset: Any = 0, kv_offset: int = 0,
                      mask_function: Any = None, attention_mask: Optional[torch.Tensor] = None,
                      local_size: Optional[int] = None, allow_is_causal_skip: bool = True,
                      device: Any = "cpu", **kwargs: Any) -> Optional[torch.Tensor]:
    """transformers' mask interface: key lengths (int32 [B]) for a plain causal prefix of the cache, else
    what transformers' SDPA mask function returns (None where is_causal suffices, or a boolean mask)."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    mask_function = causal_mask_function if mask_function is None else mask_function
    prefix = (mask_function is causal_mask_function and attention_mask is None and local_size is None
              and kv_offset == 0 and q_length <= MAX_LENS_QUERIES)
    if not prefix or (allow_is_causal_skip and (q_length == 1 or kv_length == q_length)):
        return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                         kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
                         local_size=local_size, allow_is_causal_skip=allow_is_causal_skip, device=device, **kwargs)
    # Query i (absolute position q_offset + i) sees keys 0 .. q_offset + i: the first q_offset + q_length,
    # bottom-right aligned. q_offset is a GPU tensor for a static cache: no host sync, graph-safe.
    if isinstance(q_offset, torch.Tensor):
        return (q_offset.reshape(1) + q_length).to(device=device, dtype=torch.int32).expand(batch_size).contiguous()
    return torch.full((batch_size,), int(q_offset) + q_length, dtype=torch.int32, device=device)


def transformers_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask: Optional[torch.Tensor], dropout: float = 0.0,
                           scaling: Optional[float] = None, is_causal: Optional[bool] = None,
                           **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: q [B, H, Sq, D], k/v [B, Hkv, Sk, D]; returns ([B, Sq, H, D], None)."""
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(causal) and query.shape[2] > 1
    if attention_mask is not None and attention_mask.dim() == 1:  # key lengths from transformers_mask
        return _attention_with_lens(module, query, key, value, attention_mask, dropout, scaling, kwargs)
    if causal and attention_mask is None and key.shape[2] > query.shape[2]:
        # Prefill into an empty static cache: transformers' causal is top-left here, which is the first
        # Sq keys (what its SDPA path slices too); the view keeps the kernel's bottom-right rule exact.
        key, value = key[:, :, :query.shape[2]], value[:, :, :query.shape[2]]
    grads = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
    if (attention_mask is not None or dropout or grads or kwargs.get("position_bias") is not None
            or kwargs.get("output_attentions") or (causal and query.shape[2] != key.shape[2])):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = attention(query, key, value, causal=causal, scale=scaling, fallback="sdpa")
    return out.transpose(1, 2).contiguous(), None


def _attention_with_lens(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         seq_lens: torch.Tensor, dropout: float, scaling: Optional[float],
                         kwargs: dict[str, Any]) -> tuple[torch.Tensor, None]:
    """Causal attention over each row's first seq_lens[b] keys: the decode kernels, else masked SDPA."""
    if dropout or kwargs.get("position_bias") is not None or kwargs.get("output_attentions"):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        mask = lens_mask(seq_lens, query.shape[2], key.shape[2], causal=True)
        return sdpa_attention_forward(module, query, key, value, mask, dropout=dropout, scaling=scaling,
                                      is_causal=False, **kwargs)
    out = attention(query, key, value, causal=True, scale=scaling, fallback="sdpa", seq_lens=seq_lens)
    return out.transpose(1, 2).contiguous(), None
