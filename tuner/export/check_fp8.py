"""tuner export --check of an e4m3 cell or an FP8 KV cache's: the fallback timed against the kernels, as the
package runs it (its own dequantisation, to bfloat16 for e4m3 and to q's dtype for a cache, then SDPA). The
cell's inputs and reference are the search's (tuner.runtime.verify.fp8_inputs, the real values by
tuner.runtime.fp8.dequantized_inputs)."""

from __future__ import annotations

import importlib
from typing import Any

from tuner.export.check_paged import preceded


def dequantising(pkg: Any, baselines: list[Any], q: Any, k: Any, v: Any, descales: tuple[Any, Any, Any],
                 buffers: tuple[Any, Any, Any]) -> list[Any]:
    """`baselines` (timed on `buffers`, the bfloat16 values) as the package's fallback of an FP8 call runs them:
    each call dequantises q, k, v into the buffers first (the package's fp8_call.dequantised), then runs."""
    fp8 = importlib.import_module(f"{pkg.__name__}._runtime.fp8_call")
    return preceded(baselines, lambda: fp8.dequantised(q, k, v, descales, buffers))


def dequantised(pkg: Any, q: Any, k: Any, v: Any, descales: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
    """The bfloat16 inputs the package's fallback of an FP8 call runs on."""
    return importlib.import_module(f"{pkg.__name__}._runtime.fp8_call").dequantised(q, k, v, descales)


def cache_dequantised(pkg: Any, q: Any, k: Any, v: Any, descales: tuple[Any, Any, Any]) -> tuple[Any, Any]:
    """The k and v (in q's dtype) the package's fallback of an FP8-cache call runs on (descales: (None, k_scale,
    v_scale), [B, Hkv] each)."""
    cache = importlib.import_module(f"{pkg.__name__}._runtime.fp8_cache")
    return cache.dequantised(k, descales[1], q.dtype), cache.dequantised(v, descales[2], q.dtype)


def cache_dequantising(pkg: Any, baselines: list[Any], q: Any, k: Any, v: Any, descales: tuple[Any, Any, Any],
                       buffers: tuple[Any, Any]) -> list[Any]:
    """`baselines` (timed on q and `buffers`) as the package's fallback of an FP8-cache call runs them: each call
    dequantises k and v first (the package's fp8_cache.dequantised), then runs."""
    cache = importlib.import_module(f"{pkg.__name__}._runtime.fp8_cache")

    def step() -> None:  # what the package's fallback does, written into the buffers the baselines read
        cache.dequantised(k, descales[1], q.dtype, out=buffers[0])
        cache.dequantised(v, descales[2], q.dtype, out=buffers[1])

    return preceded(baselines, step)
