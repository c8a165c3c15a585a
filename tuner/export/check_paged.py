"""tuner export --check of a paged cell: the fallback timed as the package runs it, each call gathering the
pages into a dense copy (the package's paged.gather_pages) before SDPA; and the wrapper that puts such a step
of the package's fallback in front of each timed baseline call (an e4m3 cell's dequantisation too)."""

from __future__ import annotations

import importlib
from typing import Any, Callable


def preceded(baselines: list[Any], step: Callable[[], Any]) -> list[Any]:
    """`baselines` with `step` run first inside each of their timed calls (the same names and SDPA backends)."""
    from tuner.runtime.baselines import Baseline

    def call(run: Callable[[], Any]) -> Callable[[], Any]:
        return lambda: (step(), run())[1]

    return [Baseline(b.name, call(b.call), b.backend) for b in baselines]


def gathered(pkg: Any, data: dict[str, Any], seq_k: int) -> tuple[tuple[Any, Any], Callable[[], None]]:
    """Dense K/V buffers [B, Hkv, seq_k, D] of a paged cell's caches (data: check.cell_inputs()'s), and the step
    that gathers the pages into them as the package's fallback of a paged call does."""
    import torch

    paged = importlib.import_module(f"{pkg.__name__}._runtime.paged")
    table, caches = data["block_table"], (data["k_cache"], data["v_cache"])
    pages = [torch.empty((table.numel(), *c.shape[1:]), dtype=c.dtype, device=c.device) for c in caches]

    k, v = (paged.gather_pages(cache, table, out=out)[:, :, :seq_k] for cache, out in zip(caches, pages))

    def gather() -> None:
        for cache, out in zip(caches, pages):
            paged.gather_pages(cache, table, out=out)

    return (k, v), gather
