"""FP8 (e4m3) inputs of the Hopper kernels: V's transposed copy and the descale factors' checks.

FP8 wgmma reads both operands K-major, so P V needs V with the keys contiguous: V^T. Before each launch the
launcher has the cubin's own transpose kernel copy V [B, Hkv, Sk, D] into V^T [B, Hkv, D, Sk'] (Sk' = Sk
rounded up to 16, the tail zero), the keys of every 16 in the order the kernel's P fragment holds them:
fragment column a = 4t + 2h + j holds key 8h + 2t + j (attn_fwd_wgmma/consumer_mainloop.h, pack_p), so P
needs no shuffles in registers. The copy reads and writes B·Hkv·Sk·D bytes once each: about 2% of an S8192
D128 prefill, less with GQA.
"""

from __future__ import annotations

from typing import Any

from .cuda_driver import AttentionInputError, DriverKernel, stream_getter


def is_fp8(t: Any) -> bool:
    import torch

    return t.dtype == getattr(torch, "float8_e4m3fn", None)


class VTransposer:
    """fc_v_transpose_e4m3 of an e4m3 kernel's cubin (attn_fwd_wgmma/v_transpose.h): V [B, Hkv, Sk, D] (any
    strides, D contiguous) -> V^T [B, Hkv, D, Sk'] as the kernel reads it, on torch's current stream."""

    ENTRY = "fc_v_transpose_e4m3"
    KEYS, DIMS, THREADS = 64, 32, 128  # its tile and block (v_transpose.h)

    def __init__(self, cubin: bytes, device: int) -> None:
        self._kernel = DriverKernel(cubin, self.ENTRY, 0, "PPqqqiiii", 1, device)
        self._stream = stream_getter()
        self._device = device

    def __call__(self, v: Any) -> Any:
        b, h, s, d = v.shape
        vt = v_transposed_like(v)
        s16 = vt.shape[3]
        grid = (-(-s16 // self.KEYS), d // self.DIMS, b * h)
        vs = v.stride()
        self._kernel.launch(grid, (self.THREADS, 1, 1), (v.data_ptr(), vt.data_ptr(), vs[0], vs[1], vs[2], h, s, s16, d),
                            0, self._stream(self._device))
        return vt


def v_transposed_like(v: Any) -> Any:
    """An uninitialised tensor of V^T's shape and layout (VTransposer's output) (for tensor maps that need a layout)."""
    import torch

    b, h, s, d = v.shape
    return torch.empty(b, h, d, -(-s // 16) * 16, dtype=v.dtype, device=v.device)


def check_descales(q: Any, k: Any, descales: Any, kv_only: bool = False) -> None:
    """Check that each of (q_descale, k_descale, v_descale) is a contiguous float32 [B, Hkv] tensor on q's
    device (kv_only, an FP8 KV cache's: q_descale None, k's and v's the cache's k_scale and v_scale);
    AttentionInputError names the first that is not. k: [B or pages, Hkv, ...]."""
    import torch

    names = ("q_descale", "k_descale", "v_descale") if not kv_only else ("q_descale", "k_scale", "v_scale")
    if not isinstance(descales, (tuple, list)) or len(descales) != 3 or (kv_only and descales[0] is not None):
        what = "descales=(q_descale, k_descale, v_descale)" if not kv_only else "descales=(None, k_scale, v_scale)"
        raise AttentionInputError(f"{'FP8 KV-cache' if kv_only else 'e4m3'} kernels take {what}, float32 [B, Hkv] each")
    want = (q.shape[0], k.shape[1])
    for name, t in list(zip(names, descales))[1 if kv_only else 0:]:
        if (not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or tuple(t.shape) != want
                or not t.is_contiguous() or t.device != q.device):
            raise AttentionInputError(f"{name} must be a contiguous float32 tensor of shape {want} (batch, K/V heads) "
                                      f"on {q.device}")
