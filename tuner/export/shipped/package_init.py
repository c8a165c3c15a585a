"""Tuned fused-attention kernels exported by FlashCore tuner (provenance in manifest.json).

    from PACKAGE import attention
    out = attention(q, k, v, causal=True)       # q [B, H, Sq, D], k/v [B, Hkv, Sk, D] on CUDA
    out = attention(q, k_cache, v_cache, block_table=table, seq_lens=lens)  # a paged cache (decode)
    print(attention.explain(q, k, v, causal=True))
    PACKAGE.register_transformers()             # attn_implementation="tuned_attention" in transformers

Copied verbatim by `tuner export` as the package's __init__.py. Importing
checks every shipped cubin and source against manifest.json's sha256.
"""

from ._kernels import MANIFEST, IntegrityError, verify_package

verify_package()

from ._api import attention, explain  # noqa: E402 - only after the integrity check
from ._hf import register_transformers  # noqa: E402
from ._launcher import AttentionInputError, GpuUnavailableError  # noqa: E402

__version__: str = MANIFEST["version"]
__all__ = ["AttentionInputError", "GpuUnavailableError", "IntegrityError", "MANIFEST", "attention", "explain",
           "register_transformers"]
