"""The one path from a variant to a runnable kernel: render -> compile -> (in a GPU process) load.

    built = build(variant, "sm_90a")   # no GPU needed: nvcc, cached by content hash
    kernel = built.load(device=0)      # PyCUDA, inside torch's context

`build` runs where the compiler is (the search's compile pool, export, tests);
a BuiltKernel is plain picklable data, so a GPU worker process can `load` it.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Sequence

from tuner.errors import TunerError
from tuner.kernels.compiler import CompileResult, compile_source
from tuner.kernels.feasibility import resources
from tuner.kernels.render import render
from tuner.kernels.variant import Variant
from tuner.runtime.driver import cuda_driver
from tuner.runtime.shipped.launcher import AttentionKernel, LaunchShape


def launch_shape(variant: Variant) -> LaunchShape:
    """How the launcher runs this variant: block rows, threads, shared memory, TMA boxes."""
    res = resources(variant)
    return LaunchShape(int(variant.params["BLOCK_M"]), res["threads"], res.get("smem_bytes", 0),
                       res.get("tma_swizzle", 0), res.get("tma_kv_rows", 0), res.get("tma_q_rows", 0),
                       bool(res.get("persistent", 0)), res.get("splits", 0), bool(res.get("workspace_merge", 0)),
                       bool(res.get("descales", 0)), bool(res.get("fp8", 0)), bool(res.get("kv_fp8", 0)),
                       variant.packed)


@dataclass(frozen=True)
class BuiltKernel:
    """A rendered and compiled variant: its source, nvcc's result and how to launch it."""

    variant: Variant
    source: str
    compiled: CompileResult
    shape: LaunchShape

    @property
    def ok(self) -> bool:
        return self.compiled.ok

    @property
    def entry(self) -> str:
        return self.compiled.entry

    def load(self, device: int = 0, cubin: bytes | None = None) -> AttentionKernel:
        """Load the cubin (read from the compile cache unless given) into torch's CUDA context on
        `device` (NoGpuError without one)."""
        if not self.compiled.ok:
            raise TunerError(f"{self.entry}: no cubin to load (compile failed)")
        cuda_driver(device)
        return AttentionKernel(self.compiled.cubin if cubin is None else cubin, self.entry, self.shape, device)


def build(variant: Variant, arch: str, *, use_cache: bool = True, lineinfo: bool = False) -> BuiltKernel:
    """Render and compile one variant for `arch`; a failed compile is a result (built.ok is False).
    `lineinfo` adds ncu's source-line map (same machine code, other debug sections)."""
    source = render(variant)
    compiled = compile_source(source, variant.name, arch, use_cache=use_cache, lineinfo=lineinfo)
    return BuiltKernel(variant, source, compiled, launch_shape(variant))


def build_many(variants: Sequence[Variant], arch: str, workers: int | None = None) -> list[BuiltKernel]:
    """build() of every variant in a process pool (nvcc is single-threaded), results in order."""
    workers = workers or max(1, os.cpu_count() or 2)
    if workers == 1 or len(variants) <= 1:
        return [build(v, arch) for v in variants]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(build, variants, [arch] * len(variants)))
