"""The choice every call form shares: the dispatch table, the inputs nothing can compute, the kernel to load.

Part of the runtime every export ships (this folder, copied whole).
"""

from functools import lru_cache
from typing import Any

import torch

from . import kernels as _kernels
from .dispatch import DispatchTable, Key
from .dtypes import DTYPES as _SPECS, ELEMENTS
from .launcher import AttentionInputError


@lru_cache(maxsize=1)
def table() -> DispatchTable:
    """The package's dispatch table, built once from its manifest: measured cells (tuner export --check)
    decide their keys; other keys take the nearest tuned entry."""
    manifest = _kernels.manifest()
    return DispatchTable(manifest["entries"], manifest.get("checked", {}).get("cells", []))


# The input dtypes a package's table can hold (Problem's names), by q's torch dtype: the registry's (its copy in
# dtypes.py) whose q, k and v are one type (an FP8 cache's key comes from its q's: fp8_cache.py). float8_e4m3fn
# calls come with descales (fp8_call.py).
DTYPES = {getattr(torch, ELEMENTS[s["query"]]["torch"]): name for name, s in _SPECS.items() if s["query"] == s["kv"]}
FALLBACKS = (None, "sdpa")


def cell(dtype: torch.dtype, qs: Any, ks: Any, causal: bool, mask: tuple) -> tuple:
    """A dispatch cache's key: (dtype, D, causal, H // Hkv, Sq bucket, Sk bucket, B x H bucket, mask)."""
    return (dtype, qs[3], bool(causal), qs[1] // ks[1], (qs[2] - 1).bit_length(), (ks[2] - 1).bit_length(),
            (qs[0] * qs[1] - 1).bit_length(), mask)


def refuse_unscaled_fp8(q: Any, k: Any, v: Any) -> None:
    """float8_e4m3fn inputs mean nothing without their descales: a call without them raises, fallback or not
    (the 16-bit paths' slow checks call this; calls with descales go to fp8_call.py)."""
    if any(isinstance(t, torch.Tensor) and t.dtype == torch.float8_e4m3fn for t in (q, k, v)):
        raise AttentionInputError("float8_e4m3fn inputs need q_descale, k_descale and v_descale (float32 [B, Hkv] "
                                  "each: real = stored * descale)")


def check_structure(q: Any, k: Any, v: Any, *, paged: bool = False) -> None:
    """What no implementation can compute, so that even fallback='sdpa' raises a one-line AttentionInputError
    (SDPA would return NaN, broadcast the batch or fail inside torch): k and v of different shapes, no k/v head,
    no key; for rank-4 calls also q's batch (not `paged`: k and v are then the pages), head dim and heads against
    k's, and dtypes (k and v one dtype; q's the same, or 16-bit with an FP8 cache). Other shapes go to the kernels'
    checks, and a rank other than 4 to SDPA's."""
    if q.dim() < 3 or k.dim() < 3 or v.dim() < 3:
        return  # SDPA's own checks name what is wrong
    if k.shape[-2] != v.shape[-2] or k.shape[-3] != v.shape[-3]:
        raise AttentionInputError(f"k and v must have the same heads and length (k {tuple(k.shape)}, "
                                  f"v {tuple(v.shape)})")
    if k.shape[-3] == 0:
        raise AttentionInputError(f"k and v must have at least one head (k {tuple(k.shape)})")
    if k.shape[-2] == 0:
        raise AttentionInputError("k and v must have at least one key (Sk = 0)")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return
    shapes = f"(q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)})"
    if not paged and not q.shape[0] == k.shape[0] == v.shape[0]:
        raise AttentionInputError(f"q, k and v must have the same batch {shapes}")
    if q.shape[3] != k.shape[3] or v.shape[3] != k.shape[3]:
        raise AttentionInputError(f"q, k and v must have the same head dim {shapes}")
    if q.shape[1] % k.shape[1]:
        raise AttentionInputError(f"q's heads must be a multiple of k's and v's (GQA) {shapes}")
    if k.dtype != v.dtype or (q.dtype != k.dtype and k.dtype != torch.float8_e4m3fn):
        raise AttentionInputError(f"q, k and v must have one dtype (got {q.dtype}, {k.dtype}, {v.dtype}); an FP8 KV "
                                  f"cache is float8_e4m3fn k and v with float16 or bfloat16 q")


def refuse_grads(*tensors: Any) -> None:
    """The kernels are forward-only: a call that needs gradients must not run them."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        raise AttentionInputError("the tuned kernels are forward-only: inputs require grad "
                                  "(use torch.no_grad() / inference_mode, or fallback='sdpa')")


def choose_kernel(q: Any, key: Key) -> Any:
    """The loaded kernel the table chooses for `key` (an AttentionKernel), or None for a cell routed to SDPA."""
    choice = table().choose(key)
    if choice is None:
        raise AttentionInputError(table().unsupported_reason(key))
    if choice.route == "sdpa":
        return None
    # The fast path re-checks each call's layout (cached per layout) and alignment in the kernel's launch_if_fit.
    return _kernels.load_kernel(choice.entry["kernel"], q.get_device())
