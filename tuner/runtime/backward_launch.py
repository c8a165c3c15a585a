"""Launch a compiled attention backward variant (a template with pass = "backward", e.g. attn_bwd_mma) on torch
tensors: dQ, dK and dV from q, k, v, the forward's output and log-sum-exp, and dO.

    built = build(variant, "sm_80")                   # tuner.runtime.build: render + nvcc (cached)
    backward = BackwardKernel(built)                   # its three entry points, loaded in torch's context
    dq, dk, dv = backward(q, k, v, o, lse, do, scale)  # on torch's current stream

The launch itself is the shipped runtime's (tuner.runtime.shipped.backward_kernel, what an export runs): this layer
reads the variant's launch facts from its template's manifest (backward_shape, also what an export records).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tuner.errors import TunerError
from tuner.kernels.feasibility import resources
from tuner.kernels.manifest import load_manifest
from tuner.kernels.variant import Variant
from tuner.runtime.build import BuiltKernel
from tuner.runtime.driver import cuda_driver
from tuner.runtime.shipped.backward_kernel import ARG_FORMAT, BackwardLauncher, BackwardShape

__all__ = ["ARG_FORMAT", "BackwardKernel", "backward_shape"]


def backward_shape(variant: Variant) -> BackwardShape:
    """The launch facts of a backward variant, from its template's resource formulas."""
    manifest = load_manifest(variant.template)
    if manifest.kernel_pass != "backward":
        raise TunerError(f"{variant.name} is a {manifest.kernel_pass} kernel, not a backward one")
    res = resources(variant, manifest)
    return BackwardShape(dtype=variant.dtype, head_dim=variant.head_dim, block_n=int(variant.params["BLOCK_N"]),
                         threads=int(res["threads"]), smem_bytes=int(res["smem_bytes"]),
                         aux_threads=int(res["aux_threads"]), aux_rows=int(res["aux_rows"]),
                         lse_row_pad=int(res["lse_row_pad"]), tma_rows=int(res.get("tma_rows") or 0),
                         dq_tiled=bool(res.get("dq_tiled", 0)))


def shape_dict(variant: Variant) -> dict[str, Any]:
    """backward_shape as the JSON an export's manifest records (the shipped loader rebuilds it)."""
    return dataclasses.asdict(backward_shape(variant))


class BackwardKernel(BackwardLauncher):
    """A compiled backward variant's three kernels, loaded on `device` and ready to launch on torch tensors
    (BackwardLauncher's __call__ and launcher)."""

    def __init__(self, built: BuiltKernel, device: int = 0) -> None:
        shape = backward_shape(built.variant)
        if not built.ok:
            raise TunerError(f"{built.entry}: no cubin to load (compile failed)")
        self.variant = built.variant
        self.block_n, self.threads, self.smem_bytes = shape.block_n, shape.threads, shape.smem_bytes
        self.aux_threads, self.aux_rows, self.row_pad = shape.aux_threads, shape.aux_rows, shape.lse_row_pad
        cuda_driver(device)  # torch's context on `device` (NoGpuError without a GPU), as BuiltKernel.load
        super().__init__(built.compiled.cubin, built.entry, shape, device)
