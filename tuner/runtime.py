"""The only module that talks to the CUDA driver through PyCUDA.

PyCUDA shares torch's primary context (torch.cuda is initialised first), so a
kernel loaded here reads and writes torch tensors directly.
"""

from __future__ import annotations

import atexit
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tuner.errors import NoGpuError, TunerError

_ARG_FORMAT = "PPPPP" + "q" * 12 + "iiif"
_DEFAULT_SMEM_LIMIT = 48 * 1024  # above this a kernel must opt in to more dynamic shared memory
_state: dict[str, Any] = {}


def cuda_driver(device: int = 0) -> Any:
    """Initialise torch's CUDA and bind PyCUDA to the same primary context."""
    if "drv" in _state:
        return _state["drv"]
    import torch

    if not torch.cuda.is_available():
        raise NoGpuError("no CUDA GPU is visible to torch on this machine")
    try:
        import pycuda.driver as drv
    except ImportError as exc:
        raise NoGpuError(f"pycuda is not installed ({exc}); install the gpu extra: pip install 'flashcore-tuner[gpu]'") from None
    torch.cuda.set_device(device)
    torch.cuda.init()
    torch.zeros(1, device=f"cuda:{device}")  # make torch create (and make current) its primary context
    drv.init()
    ctx = drv.Device(device).retain_primary_context()
    ctx.push()
    _state.update(drv=drv, ctx=ctx, device=device)
    atexit.register(_release_context)
    return drv


def _release_context() -> None:
    """Pop our context at exit; PyCUDA aborts the process if one is left on its stack."""
    ctx = _state.pop("ctx", None)
    if ctx is not None:
        ctx.pop()
        from pycuda.tools import clear_context_caches

        clear_context_caches()


@dataclass(frozen=True)
class LaunchShape:
    block_m: int
    threads: int
    smem_bytes: int


class AttentionKernel:
    """A compiled attention variant, loaded and ready to launch on torch tensors."""

    def __init__(self, cubin: bytes, entry: str, shape: LaunchShape, device: int = 0) -> None:
        drv = cuda_driver(device)
        self.entry = entry
        self.shape = shape
        self._module = drv.module_from_buffer(cubin)
        self._fn = self._module.get_function(entry)
        if shape.smem_bytes > _DEFAULT_SMEM_LIMIT:
            self._fn.set_attribute(drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, shape.smem_bytes)
        self._fn.prepare(_ARG_FORMAT)
        self.registers = self._fn.get_attribute(drv.function_attribute.NUM_REGS)

    def __call__(self, q: Any, k: Any, v: Any, out: Any, lse: Any = None, scale: float | None = None) -> None:
        """Launch on the default stream. Tensors are logical [B, H, S, D] with any strides."""
        check_attention_tensors(q, k, v, out, lse)
        b, h, sq, d = q.shape
        hkv, sk = k.shape[1], k.shape[2]
        scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
        grid = (math.ceil(sq / self.shape.block_m), h, b)
        self._fn.prepared_call(
            grid, (self.shape.threads, 1, 1),
            np.uintp(q.data_ptr()), np.uintp(k.data_ptr()), np.uintp(v.data_ptr()), np.uintp(out.data_ptr()),
            np.uintp(lse.data_ptr() if lse is not None else 0),
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
            np.int32(sq), np.int32(sk), np.int32(h // hkv), np.float32(scale),
            shared_size=self.shape.smem_bytes,
        )


def check_attention_tensors(q: Any, k: Any, v: Any, out: Any, lse: Any = None) -> None:
    """Raise TunerError naming the first limit the tensors break."""
    import torch

    for name, t in (("q", q), ("k", k), ("v", v), ("out", out)):
        if not isinstance(t, torch.Tensor):
            raise TunerError(f"{name} must be a torch.Tensor")
        if not t.is_cuda:
            raise TunerError(f"{name} must be a CUDA tensor (got device {t.device})")
        if t.dim() != 4:
            raise TunerError(f"{name} must have rank 4 [B, H, S, D] (got shape {tuple(t.shape)})")
        if t.dtype not in (torch.float16, torch.bfloat16) or t.dtype != q.dtype:
            raise TunerError(f"{name} must be float16 or bfloat16 like q (got {t.dtype}, q is {q.dtype})")
        if t.stride(3) != 1:
            raise TunerError(f"{name} must be contiguous in the head dim (stride {t.stride(3)})")
        if any(s % 8 for s in t.stride()[:3]) or t.data_ptr() % 16:
            raise TunerError(f"{name} strides must be multiples of 8 elements and its data 16-byte aligned")
    b, h, sq, d = q.shape
    if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d:
        raise TunerError(f"k and v must be [B, Hkv, Sk, D] matching q's B and D (q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)})")
    if h % k.shape[1]:
        raise TunerError(f"q heads ({h}) must be a multiple of k/v heads ({k.shape[1]})")
    if tuple(out.shape) != tuple(q.shape):
        raise TunerError(f"out must have q's shape {tuple(q.shape)} (got {tuple(out.shape)})")
    if lse is not None and (lse.dtype != torch.float32 or tuple(lse.shape) != (b, h, sq) or not lse.is_contiguous()):
        raise TunerError(f"lse must be a contiguous float32 tensor of shape {(b, h, sq)}")
