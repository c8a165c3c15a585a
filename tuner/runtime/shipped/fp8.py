"""FP8 (e4m3) inputs of the Hopper kernels: V's transposed copy and the descale factors' checks.

FP8 wgmma reads both operands K-major, so P V needs V with the keys contiguous: V^T. The launcher copies
V [B, Hkv, Sk, D] into V^T [B, Hkv, D, Sk'] (Sk' = Sk rounded up to 16, the tail zero) before each launch,
with the keys of every 16 in the order the kernel's P fragment holds them: fragment column a = 4t + 2h + j
holds key 8h + 2t + j (attn_fwd_wgmma/consumer_mainloop.h, pack_p), so P needs no shuffles in registers.
The copy reads and writes B·Hkv·Sk·D bytes once each: about 2% of an S8192 D128 prefill, less with GQA.
"""

from __future__ import annotations

from typing import Any

from .cuda_driver import AttentionInputError


def is_fp8(t: Any) -> bool:
    import torch

    return t.dtype == getattr(torch, "float8_e4m3fn", None)


def v_transposed(v: Any) -> Any:
    """V [B, Hkv, Sk, D] (any strides, e4m3) as the kernel reads it: [B, Hkv, D, Sk'] contiguous, the keys
    of every 16 permuted (this module's docstring), Sk' = Sk rounded up to 16 with zero keys after Sk."""
    import torch

    b, h, s, d = v.shape
    s16 = -(-s // 16) * 16
    x = v.view(torch.uint8)  # same element size: a view at any strides; copies and pads are byte moves
    if s16 != s:
        x = torch.nn.functional.pad(x, (0, 0, 0, s16 - s))
    # key 16g + 8h + 2t + j -> column 16g + 4t + 2h + j
    x = x.view(b, h, s16 // 16, 2, 4, 2, d).permute(0, 1, 6, 2, 4, 3, 5)
    return x.reshape(b, h, d, s16).view(v.dtype)


def v_transposed_like(v: Any) -> Any:
    """An uninitialised tensor with v_transposed(v)'s shape and layout (for tensor maps that need a layout)."""
    import torch

    b, h, s, d = v.shape
    return torch.empty(b, h, d, -(-s // 16) * 16, dtype=v.dtype, device=v.device)


def check_descales(q: Any, k: Any, descales: Any) -> tuple[int, int, int]:
    """The data pointers of (q_descale, k_descale, v_descale), after checking each is a contiguous float32
    [B, Hkv] tensor on q's device; AttentionInputError names the first that is not."""
    import torch

    if not isinstance(descales, (tuple, list)) or len(descales) != 3:
        raise AttentionInputError("e4m3 kernels take descales=(q_descale, k_descale, v_descale), float32 [B, Hkv] each")
    want = (q.shape[0], k.shape[1])
    for name, t in zip(("q_descale", "k_descale", "v_descale"), descales):
        if (not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or tuple(t.shape) != want
                or not t.is_contiguous() or t.device != q.device):
            raise AttentionInputError(f"{name} must be a contiguous float32 tensor of shape {want} (batch, K/V heads) "
                                      f"on {q.device}")
    return descales[0].data_ptr(), descales[1].data_ptr(), descales[2].data_ptr()
