"""The Hopper backward's consumer loop held at the instruction counts reached (issue 40; the forward's budget is
tests/test_sass_budget.py): compiled on the CPU, counted in cuobjdump's SASS. Each step's figures are in
benchmarks/NOTES.md (session 24)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kernel_builds import compile_clean, needs_nvcc, sass
from tuner.kernels.sass_budget import functions, main_loop

# Static instructions of the consumer's loop (one query tile: S^T, dP^T, dV, dK and dQ's wgmmas), the R2UR it may
# keep, and the kernel's whole size. Session 24: at BLOCK_M 64 the warpgroup index is broadcast from lane 0
# (descriptors on the uniform datapath: R2UR 63 -> 0 and -150 a tile), dS^T is stored by stmatrix (-35), and a
# partial tile's mask is a branch of its own (ptxas had predicated its compares onto every tile: -161 causal).
# BLOCK_M 128 keeps the warpgroup index per thread (the broadcast spilled there), hence its R2UR.
REACHED: dict[str, tuple[int, int, int]] = {
    "attn_bwd_wgmma_d128_bf16_m64n128_s2_bulk_pw": (497, 0, 1648),
    "attn_bwd_wgmma_d128_bf16_m64n128_s2_bulk_pw_causal": (572, 0, 1752),
    "attn_bwd_wgmma_d64_fp16_m64n64_s2_bulk_pw_causal": (501, 0, 1232),
    "attn_bwd_wgmma_d64_bf16_m128n128_s2": (947, 32, 1544),
    # BLOCK_M 80 (dQ^T = K^T dS^T, FlashAttention-3's D128 tile): 461 for 80 query rows, against 497 for 64.
    # Session 25 (branch bwd-bm80-b): 463, the staging block handed over in halves (a warp's half's barrier ids
    # made each tile from the broadcast warp index: from the per-thread one, held across the loop, they spilled 8
    # bytes); the writer's two halves +16 in the kernel. lse's first 4 of 10 blocks read before the S^T wgmmas: 463.
    "attn_bwd_wgmma_d128_bf16_m80n128_s2_bulk_pw": (463, 0, 1856),
}


@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize("name", sorted(REACHED))
def test_the_consumer_loop_stays_within_its_instruction_budget(name: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """No more R2UR than reached, no YIELD (no C++ retry loop in a consumer's wait), and no more than 2% over the
    loop's and the kernel's instructions; a causal loop's mask runs only on partial tiles (a skippable block)."""
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    code = sass(compile_clean(name).cubin, tmp_path)
    loop = main_loop(code, name)
    total, r2ur, function_total = REACHED[name]
    assert loop.counts["R2UR"] <= r2ur, loop.counts
    assert loop.counts["YIELD"] == 0, loop.counts
    assert loop.total <= total * 1.02, (loop.total, total, loop.counts)
    assert len(functions(code)[loop.function]) <= function_total * 1.02
    if name.endswith("_causal"):
        assert loop.conditional >= 64, loop.conditional  # the mask's compares, under a branch
