"""Hugging Face transformers integration: register_transformers() makes the tuned kernels an attention
implementation of transformers' attention interface.

Copied verbatim by `tuner export`; transformers is optional and imported only when registering.

    import PACKAGE, transformers
    name = PACKAGE.register_transformers()
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=name)

Masks: the name is registered with transformers' SDPA mask function, so a batch without padding
reaches the attention as "no mask" (causal from the module) and runs the tuned kernel; a padding
mask (a static cache's decode steps pass one), dropout, gradients, a causal call with more queries
than keys or a shape the kernels cannot take go to transformers' own SDPA path,
so results are SDPA's wherever the kernel does not apply.
"""

from typing import Any, Optional

import torch

from ._api import attention

DEFAULT_NAME = "tuned_attention"


def register_transformers(name: str = DEFAULT_NAME) -> str:
    """Register the kernels under `name` (attention and mask function); returns the name to pass as
    `attn_implementation`. Names containing "flash" are refused: transformers takes them for hub kernels."""
    if "flash" in name.lower():
        raise ValueError(f"attention implementation name {name!r} contains 'flash': transformers would take it "
                         "for a hub kernel request; choose another name")
    try:
        from transformers import AttentionInterface, AttentionMaskInterface
        from transformers.masking_utils import sdpa_mask
    except ImportError as exc:
        raise ImportError(f"register_transformers needs transformers (pip install transformers): {exc}") from None
    AttentionInterface.register(name, transformers_attention)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def transformers_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask: Optional[torch.Tensor], dropout: float = 0.0,
                           scaling: Optional[float] = None, is_causal: Optional[bool] = None,
                           **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: q [B, H, Sq, D], k/v [B, Hkv, Sk, D]; returns ([B, Sq, H, D], None)."""
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(causal) and query.shape[2] > 1
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
