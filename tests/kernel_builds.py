"""Compile a named variant for sm_90a and read its SASS: what the kernel tests assert on before any GPU."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tuner.kernels.compiler import CompileResult, compile_source
from tuner.kernels.render import render
from tuner.kernels.variant import parse_variant_name

SERIALIZED = "wgmma.mma_async instructions are serialized"  # ptxas's note (C75xx) when it gives up overlap
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH (CUDA toolkit not installed)")


def compile_clean(name: str) -> CompileResult:
    """The variant's sm_90a build, asserted free of spills and of serialized wgmma: ptxas silently gives up
    all tensor-core overlap (one wgmma at a time) when, e.g., it must fence a warpgroup in a divergent path."""
    res = compile_source(render(parse_variant_name(name)), name, "sm_90a")
    assert res.ok, res.log[-2000:]
    assert res.spill_bytes == 0 and res.stack_bytes == 0, (res.registers, res.spill_bytes, res.stack_bytes)
    assert SERIALIZED not in res.log, res.log[-2000:]
    return res


def sass(cubin: bytes, folder: Path) -> str:
    """cuobjdump's SASS of a cubin; skips the test where cuobjdump is not on PATH."""
    if shutil.which("cuobjdump") is None:
        pytest.skip("cuobjdump not on PATH: SASS not checked")
    path = folder / "k.cubin"
    path.write_bytes(cubin)
    return subprocess.run(["cuobjdump", "-sass", str(path)], capture_output=True, text=True, check=True).stdout
