"""Launch a compiled attention backward variant (a template with pass = "backward", e.g. attn_bwd_mma) on torch
tensors: dQ, dK and dV from q, k, v, the forward's output and log-sum-exp, and dO.

    built = build(variant, "sm_80")                   # tuner.runtime.build: render + nvcc (cached)
    backward = BackwardKernel(built)                   # its three entry points, loaded in torch's context
    dq, dk, dv = backward(q, k, v, o, lse, do, scale)  # on torch's current stream

The three kernels run in order on torch's current stream: <name>_dot_do_o (delta = rowsum(dO * O), lse in log2
units, dQ's fp32 accumulator zeroed), <name> (dK, dV; dQ accumulated with fp32 atomics) and <name>_dq_convert.
lse is what the forward templates write: float32 [B, H, Sq], natural log, -inf for a row that sees no key.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from tuner.errors import TunerError
from tuner.kernels.feasibility import resources
from tuner.kernels.manifest import load_manifest
from tuner.runtime.build import BuiltKernel
from tuner.runtime.driver import cuda_driver
from tuner.runtime.shipped.cuda_driver import DriverKernel, TensorMapEncoder, stream_getter
from tuner.runtime.shipped.input_checks import AttentionInputError, check_attention_tensors, check_strides
from tuner.runtime.shipped.launcher import split_map, tma_arg_format
from tuner.runtime.verify import torch_dtype

# The parameter list every entry point takes (ATTN_BWD_PARAMS, kernel_templates/attn_bwd_mma/args.h): q, k, v, o,
# dout, lse, lse_log2, delta, dq_accum, dq, dk, dv; 8 x 3 strides (q, k, v, o, do, dq, dk, dv); sq, sk, heads,
# h_per_kv; scale.
ARG_FORMAT = "P" * 12 + "q" * 24 + "iiii" + "f"


TMA_MAPS = 2  # q and do


class BackwardKernel:
    """A compiled backward variant's three kernels, loaded on `device` and ready to launch on torch tensors."""

    def __init__(self, built: BuiltKernel, device: int = 0) -> None:
        manifest = load_manifest(built.variant.template)
        if manifest.kernel_pass != "backward":
            raise TunerError(f"{built.variant.name} is a {manifest.kernel_pass} kernel, not a backward one")
        if not built.ok:
            raise TunerError(f"{built.entry}: no cubin to load (compile failed)")
        res = resources(built.variant, manifest)
        self.variant = built.variant
        self.block_n, self.threads, self.smem_bytes = int(built.variant.params["BLOCK_N"]), res["threads"], res["smem_bytes"]
        self.aux_threads, self.aux_rows, self.row_pad = res["aux_threads"], res["aux_rows"], res["lse_row_pad"]
        cubin, name = built.compiled.cubin, built.entry
        cuda_driver(device)  # torch's context on `device` (NoGpuError without a GPU), as BuiltKernel.load
        # A template with `tma_rows` takes TMA maps of q and do before the list (attn_bwd_wgmma), all three entries.
        self._tma_rows = res.get("tma_rows")
        self._dq_tiled = bool(res.get("dq_tiled", 0))
        self._maps = TensorMapEncoder() if self._tma_rows else None
        kernels = [DriverKernel(cubin, entry, smem, ARG_FORMAT, 1, device)
                   for entry, smem in ((name, self.smem_bytes), (f"{name}_dot_do_o", 0), (f"{name}_dq_convert", 0))]
        if self._maps is not None:
            for kernel, entry in zip(kernels, (name, f"{name}_dot_do_o", f"{name}_dq_convert")):
                kernel.use_format(tma_arg_format(kernel, entry, TMA_MAPS, ARG_FORMAT))
        self._main, self._pre, self._convert = kernels
        self.registers = self._main.registers
        self._device = device
        self._stream = stream_getter()

    def __call__(self, q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, scale: float | None = None,
                 grads: tuple[Any, Any, Any] | None = None) -> tuple[Any, Any, Any]:
        """dq, dk, dv (laid out like q, k and v, or written into `grads`) for logical [B, H, S, D] tensors with any
        strides whose head dim is contiguous; k and v [B, Hkv, Sk, D] (GQA: H a multiple of Hkv)."""
        return self.launcher(q, k, v, o, lse, do, scale, grads)()

    def launcher(self, q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, scale: float | None = None,
                 grads: tuple[Any, Any, Any] | None = None) -> Callable[[], tuple[Any, Any, Any]]:
        """The three launches on these tensors, checked and their scratch allocated once, here: a call of the result
        launches them alone (what a trial times, as a forward's launch_unchecked) and returns dq, dk, dv. The scratch
        is reused: each call's first kernel recomputes lse_log2 and delta and zeroes dQ's accumulator."""
        import torch

        v_ = self.variant
        check_attention_tensors(q, k, v, o, lse)
        if lse is None:
            raise AttentionInputError("the backward needs the forward's lse (float32 [B, H, Sq])")
        if q.shape[3] != v_.head_dim or q.dtype != torch_dtype(v_.dtype):
            raise AttentionInputError(f"{v_.name} takes {v_.dtype} of head dim {v_.head_dim} (got q {tuple(q.shape)} "
                                      f"{q.dtype})")
        dq, dk, dv = grads or (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
        for name, t, like in (("do", do, q), ("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
            if tuple(t.shape) != tuple(like.shape) or t.dtype != like.dtype or t.device != like.device:
                raise AttentionInputError(f"{name} must be like {'k' if like is k else 'v' if like is v else 'q'} "
                                          f"({tuple(like.shape)} {like.dtype}), got {tuple(t.shape)} {t.dtype}")
            check_strides(name, t)
        b, h, sq, d = q.shape
        hkv, sk = k.shape[1], k.shape[2]
        scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
        if b * h * sq == 0 or sk == 0:
            return lambda: (dq.zero_(), dk.zero_(), dv.zero_())
        sq_pad = -(-sq // self.row_pad) * self.row_pad
        scratch = torch.empty(2, b, h, sq_pad, device=q.device, dtype=torch.float32)  # lse_log2, delta
        # dQ's fp32 accumulator: [B, H, Sq, D], or in 64 x 64 blocks over the padded rows (manifest dq_tiled)
        dq_accum = torch.empty(b, h, sq_pad if self._dq_tiled else sq, d, device=q.device, dtype=torch.float32)
        maps = () if self._maps is None else tuple(
            m for name, t in (("q", q), ("do", do)) for m in split_map(self._maps.encode(name, t, self._tma_rows, 128)))
        args = maps + (q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), do.data_ptr(), lse.data_ptr(),
                scratch[0].data_ptr(), scratch[1].data_ptr(), dq_accum.data_ptr(), dq.data_ptr(), dk.data_ptr(),
                dv.data_ptr(), *(s for t in (q, k, v, o, do, dq, dk, dv) for s in t.stride()[:3]),
                sq, sk, h, h // hkv, scale)
        device = q.device.index if q.device.index is not None else self._device
        aux_block, main_grid = (self.aux_threads, 1, 1), (-(-sk // self.block_n), hkv, b)
        pre_grid, convert_grid = (sq_pad // self.aux_rows, h, b), (-(-sq // self.aux_rows), h, b)

        def launch() -> tuple[Any, Any, Any]:
            stream = self._stream(device)  # torch's current stream at each call
            self._pre.launch(pre_grid, aux_block, args, 0, stream)
            self._main.launch(main_grid, (self.threads, 1, 1), args, self.smem_bytes, stream)
            self._convert.launch(convert_grid, aux_block, args, 0, stream)
            return dq, dk, dv

        launch.keep = (scratch, dq_accum)  # type: ignore[attr-defined]  # alive while the launcher is
        return launch
