"""Launch a compiled attention kernel on torch tensors through PyCUDA.

Standalone on purpose: this file imports nothing from `tuner`, so that an
exported kernel package (tuner export) ships it verbatim and needs only
torch, numpy and pycuda at run time. PyCUDA is bound to torch's primary
context, so kernels read and write torch tensors directly.
"""

from __future__ import annotations

import atexit
import math
from dataclasses import dataclass
from typing import Any


ARG_FORMAT = "PPPPP" + "q" * 12 + "iiif"  # q, k, v, o, lse; 4x3 strides; sq, sk, h_per_kv; scale
_DEFAULT_SMEM_LIMIT = 48 * 1024  # above this a kernel must opt in to more dynamic shared memory
_bound: dict[str, Any] = {}


class AttentionInputError(ValueError):
    """Tensors a kernel cannot take; the message names the limit."""


class GpuUnavailableError(RuntimeError):
    """No CUDA GPU visible to torch, or pycuda missing."""


def bind_torch_context(device: int = 0) -> Any:
    """Initialise torch's CUDA and push its primary context for PyCUDA; returns pycuda.driver."""
    if "drv" in _bound:
        return _bound["drv"]
    import torch

    if not torch.cuda.is_available():
        raise GpuUnavailableError("no CUDA GPU is visible to torch on this machine")
    try:
        import pycuda.driver as drv
    except ImportError as exc:
        raise GpuUnavailableError(f"pycuda is not installed ({exc}); pip install pycuda") from None
    torch.cuda.set_device(device)
    torch.cuda.init()
    torch.zeros(1, device=f"cuda:{device}")  # torch creates (and makes current) the primary context
    drv.init()
    ctx = drv.Device(device).retain_primary_context()
    ctx.push()
    _bound.update(drv=drv, ctx=ctx, device=device)
    atexit.register(_release_context)
    return drv


def _release_context() -> None:
    """Pop our context at exit; PyCUDA aborts the process if one is left on its stack."""
    ctx = _bound.pop("ctx", None)
    _bound.pop("drv", None)
    if ctx is not None:
        ctx.pop()
        from pycuda.tools import clear_context_caches

        clear_context_caches()


@dataclass(frozen=True)
class LaunchShape:
    block_m: int
    threads: int
    smem_bytes: int


def check_attention_tensors(q: Any, k: Any, v: Any, out: Any, lse: Any = None) -> None:
    """Raise AttentionInputError naming the first limit the tensors break."""
    import torch

    for name, t in (("q", q), ("k", k), ("v", v), ("out", out)):
        if not isinstance(t, torch.Tensor):
            raise AttentionInputError(f"{name} must be a torch.Tensor")
        if not t.is_cuda:
            raise AttentionInputError(f"{name} must be a CUDA tensor (got device {t.device})")
        if t.dim() != 4:
            raise AttentionInputError(f"{name} must have rank 4 [B, H, S, D] (got shape {tuple(t.shape)})")
        if t.dtype not in (torch.float16, torch.bfloat16) or t.dtype != q.dtype:
            raise AttentionInputError(f"{name} must be float16 or bfloat16 like q (got {t.dtype}, q is {q.dtype})")
        if t.stride(3) != 1:
            raise AttentionInputError(f"{name} must be contiguous in the head dim (stride {t.stride(3)})")
        if any(s % 8 for s in t.stride()[:3]) or t.data_ptr() % 16:
            raise AttentionInputError(f"{name} strides must be multiples of 8 elements and its data 16-byte aligned")
    b, h, sq, d = q.shape
    if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d:
        raise AttentionInputError(
            f"k and v must be [B, Hkv, Sk, D] matching q's B and D (q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)})")
    if h % k.shape[1]:
        raise AttentionInputError(f"q heads ({h}) must be a multiple of k/v heads ({k.shape[1]})")
    if tuple(out.shape) != tuple(q.shape):
        raise AttentionInputError(f"out must have q's shape {tuple(q.shape)} (got {tuple(out.shape)})")
    if lse is not None and (lse.dtype != torch.float32 or tuple(lse.shape) != (b, h, sq) or not lse.is_contiguous()):
        raise AttentionInputError(f"lse must be a contiguous float32 tensor of shape {(b, h, sq)}")


class AttentionKernel:
    """A compiled attention variant, loaded and ready to launch on torch tensors."""

    def __init__(self, cubin: bytes, entry: str, shape: LaunchShape, device: int = 0) -> None:
        drv = bind_torch_context(device)
        self.entry = entry
        self.shape = shape
        self._module = drv.module_from_buffer(cubin)
        self._fn = self._module.get_function(entry)
        if shape.smem_bytes > _DEFAULT_SMEM_LIMIT:
            self._fn.set_attribute(drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, shape.smem_bytes)
        self._fn.prepare(ARG_FORMAT)
        self.registers = self._fn.get_attribute(drv.function_attribute.NUM_REGS)
        self._block = (shape.threads, 1, 1)
        # prepared_call's Python wrapper (block-shape setter, an import and
        # kwargs handling per call) costs a few microseconds; where PyCUDA has
        # the underlying launcher, pack the prepared format and call it directly.
        from pycuda._pvt_struct import pack

        self._pack = pack
        self._launch_kernel = getattr(self._fn, "_launch_kernel", None)

    def __call__(self, q: Any, k: Any, v: Any, out: Any, lse: Any = None, scale: float | None = None,
                 check: bool = True) -> None:
        """Launch on the legacy default stream. Tensors are logical [B, H, S, D] with any strides."""
        if check:
            check_attention_tensors(q, k, v, out, lse)
        self.launch_unchecked(q, k, v, out, lse, scale)

    def launch_unchecked(self, q: Any, k: Any, v: Any, out: Any, lse: Any = None, scale: float | None = None) -> None:
        """The launch alone (inputs already validated): the lowest host overhead path."""
        b, h, sq, d = q.shape
        hkv, sk = k.shape[1], k.shape[2]
        scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
        qs, ks, vs, os_ = q.stride(), k.stride(), v.stride(), out.stride()
        grid = ((sq + self.shape.block_m - 1) // self.shape.block_m, h, b)
        args = (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr() if lse is not None else 0,
                qs[0], qs[1], qs[2], ks[0], ks[1], ks[2], vs[0], vs[1], vs[2], os_[0], os_[1], os_[2],
                sq, sk, h // hkv, scale)
        if self._launch_kernel is not None:
            self._launch_kernel(grid, self._block, self._pack(ARG_FORMAT, *args), self.shape.smem_bytes, None)
        else:
            self._fn.prepared_call(grid, self._block, *args, shared_size=self.shape.smem_bytes)
