"""The Hopper backward's consumer loop held at the instruction counts reached (issue 40; the forward's budget is
tests/test_sass_budget.py): compiled on the CPU, counted in cuobjdump's SASS (benchmarks/bwd_loop_count.py prints
the same figures). Each step's figures are in benchmarks/NOTES.md (sessions 24, 25 and 27)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kernel_builds import compile_clean, needs_nvcc, sass
from tuner.kernels.sass_budget import TENSOR_OPS, functions, loops, main_loop

# Static instructions of the consumer's loop a query tile (S^T, dP^T, dV, dK and dQ's wgmmas; BLOCK_M 64: the
# whole tiles' loop), the R2UR it may keep, the kernel's whole size, and the partial tiles' loop (BLOCK_M 64, which
# runs a head's partial and whole tiles in loops of their own; 0: one loop, the mask in a branch).
# Session 24: at BLOCK_M 64 the warpgroup index is broadcast from lane 0 (descriptors on the uniform datapath: R2UR
# 63 -> 0 and -150 a tile), dS^T is stored by stmatrix (-35), and a partial tile's mask is a branch of its own (-161
# causal). Session 27: ring descriptors made once (one add a tile), the loop split into partial and whole tiles,
# dQ's staging stores and descriptors from addresses made once: BLOCK_M 64 causal 572 -> 394, non-causal 497 -> 398.
# BLOCK_M 128 keeps the warpgroup index per thread (the broadcast spilled there), hence its R2UR.
REACHED: dict[str, tuple[int, int, int, int]] = {
    "attn_bwd_wgmma_d128_bf16_m64n128_s2_bulk_pw": (398, 0, 2032, 422),
    "attn_bwd_wgmma_d128_bf16_m64n128_s2_bulk_pw_causal": (394, 0, 2120, 465),
    "attn_bwd_wgmma_d128_fp16_m64n128_s2_bulk_pw_causal": (394, 0, 2120, 465),
    "attn_bwd_wgmma_d64_fp16_m64n64_s2_bulk_pw": (343, 0, 1496, 375),
    "attn_bwd_wgmma_d64_fp16_m64n64_s2_bulk_pw_causal": (338, 0, 1560, 416),
    "attn_bwd_wgmma_d128_bf16_m64n128_s2_causal": (579, 0, 2192, 648),
    "attn_bwd_wgmma_d64_bf16_m128n128_s2": (914, 32, 1512, 0),
    # BLOCK_M 80 (dQ^T = K^T dS^T, FlashAttention-3's D128 tile): one loop (split, it spilled). Session 25: 463 (the
    # staging block handed over in halves, lse's first 4 of 10 blocks read before the S^T wgmmas); session 27: 450,
    # and causal compiles without spills (516, its mask under a branch).
    "attn_bwd_wgmma_d128_bf16_m80n128_s2_bulk_pw": (450, 0, 1840, 0),
    "attn_bwd_wgmma_d128_bf16_m80n128_s2_bulk_pw_causal": (516, 0, 1920, 0),
    "attn_bwd_wgmma_d128_fp16_m80n128_s2_bulk_pw_causal": (516, 0, 1920, 0),
}


def partial_tiles_loop(code: str, name: str, whole_start: int) -> int:
    """Instructions of the innermost wgmma loop other than the whole tiles' (starting at whole_start); 0: none."""
    instrs = functions(code)[name]
    spans = [(f, last) for f, last in loops(instrs) if any(i.opcode in TENSOR_OPS for i in instrs[f:last + 1])
             and not any(i.opcode == "EXIT" for i in instrs[f:last + 1])]
    inner = [(f, last) for f, last in spans if instrs[f].addr != whole_start
             and not any(g >= f and m <= last and (g, m) != (f, last) for g, m in spans)]
    return min((last - f + 1 for f, last in inner), default=0)


@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize("name", sorted(REACHED))
def test_the_consumer_loop_stays_within_its_instruction_budget(name: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """No spills or serialised wgmmas (compile_clean), no more R2UR than reached, no YIELD (no C++ retry loop in a
    consumer's wait), and no more than 2% over the loops' and the kernel's instructions. A causal loop's mask runs
    only on partial tiles: BLOCK_M 64's whole tiles' loop holds none of it (no FSEL) and its partial tiles' loop
    does; BLOCK_M 80's mask is a skippable block of its one loop."""
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    code = sass(compile_clean(name).cubin, tmp_path)
    loop = main_loop(code, name)
    total, r2ur, function_total, partial_total = REACHED[name]
    assert loop.counts["R2UR"] <= r2ur, loop.counts
    assert loop.counts["YIELD"] == 0, loop.counts
    assert loop.total <= total * 1.02, (loop.total, total, loop.counts)
    assert len(functions(code)[loop.function]) <= function_total * 1.02
    partial = partial_tiles_loop(code, name, loop.start)
    assert partial <= partial_total * 1.02, (partial, partial_total)
    if partial_total:
        assert partial > 0
        assert loop.counts["FSEL"] == 0, loop.counts  # the whole tiles' loop sets no score to -inf
    elif name.endswith("_causal"):
        assert loop.conditional >= 64, loop.conditional  # the mask's compares, under a branch
