"""The Hopper main loop's instruction budget (issue 37): found in the SASS, and held where it was brought.

The figures are the static instructions of one main-loop iteration (one K/V tile, one warp), as
benchmarks/sass_budget.py prints them for this revision of the template (benchmarks/NOTES.md, session 18):
a change that adds non-math instructions to the loop of a representative variant by more than 2% fails
here, before any GPU timing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kernel_builds import compile_clean, needs_nvcc, sass
from tuner.kernels.sass_budget import exp2_under_pv, f2fp_after_full_wait, functions, item_code, main_loop
from tuner.kernels.variant import parse_variant_name

# A cut-down cuobjdump listing: a set-up block, an inner loop of two HGMMA with an out-of-line barrier retry,
# an outer loop around it, and the retry stub that branches back into the loop from the function's end.
LISTING = """
        Function : k
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   S2R R0, SR_TID.X ;
        /*0020*/                   UMOV UR4, 0x1 ;
        /*0030*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4+0x10], R0 ;
        /*0040*/              @!P0 BRA 0x00c0 ;
        /*0050*/                   HGMMA.64x128x16.F32 R24, gdesc[UR8], RZ, !UPT ;
        /*0060*/                   HGMMA.64x128x16.F32 R24, gdesc[UR8], R24, gsb0 ;
        /*0070*/                   MUFU.EX2 R3, R3 ;
        /*0080*/              @!P1 BRA 0x0030 ;
        /*0090*/                   IADD3 R2, R2, 0x1, RZ ;
        /*00a0*/              @!P2 BRA 0x0020 ;
        /*00b0*/                   EXIT ;
        /*00c0*/                   YIELD ;
        /*00d0*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4+0x10], R0 ;
        /*00e0*/              @!P0 BRA 0x00c0 ;
        /*00f0*/                   BRA 0x0050 ;
        .L_x_1:
        /*0100*/                   BRA 0x0100 ;
        ..........

        Function : other
        /*0000*/                   EXIT ;
"""


def test_the_main_loop_is_the_innermost_loop_with_tensor_core_work() -> None:
    loop = main_loop(LISTING)
    assert (loop.function, loop.start, loop.end) == ("k", 0x30, 0x80)
    assert loop.counts == {"SYNCS": 1, "BRA": 2, "HGMMA": 2, "MUFU": 1}
    assert loop.total == 6 and loop.non_math == 3  # the wait and the two branches
    assert loop.conditional == 0  # its one forward branch leaves the loop (the retry stub)


def test_a_loops_masked_block_is_conditional() -> None:
    listing = """
        Function : k
        /*0000*/                   HGMMA.64x128x16.F32 R24, gdesc[UR8], RZ, !UPT ;
        /*0010*/              @!P0 BRA 0x0040 ;
        /*0020*/                   ISETP.GT.AND P6, PT, R10, 0x1, PT ;
        /*0030*/                   FSEL R24, R24, -INF , P6 ;
        /*0040*/                   MUFU.EX2 R3, R3 ;
        /*0050*/              @!P1 BRA 0x0000 ;
        /*0060*/                   EXIT ;
"""
    loop = main_loop(listing)
    assert loop.total == 6 and loop.conditional == 2


def test_a_retry_stub_branching_back_mid_loop_is_not_the_main_loop() -> None:
    # The stub after EXIT jumps back to the second HGMMA: its span (0x60-0xb0) is shorter than the loop.
    listing = """
        Function : k
        /*0000*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4+0x10], R0 ;
        /*0010*/                   HGMMA.64x128x16.F32 R24, gdesc[UR8], RZ, !UPT ;
        /*0020*/                   MUFU.EX2 R3, R3 ;
        /*0030*/                   MUFU.EX2 R4, R4 ;
        /*0040*/                   MUFU.EX2 R5, R5 ;
        /*0050*/              @!P0 BRA 0x00b0 ;
        /*0060*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4+0x18], R0 ;
        /*0070*/                   HGMMA.64x128x16.F32 R24, gdesc[UR8], R24, gsb0 ;
        /*0080*/                   FADD R3, R3, R4 ;
        /*0090*/              @!P1 BRA 0x0000 ;
        /*00a0*/                   EXIT ;
        /*00b0*/                   BRA 0x0060 ;
"""
    loop = main_loop(listing)
    assert (loop.start, loop.end) == (0x0, 0x90)


def test_predicates_and_modifiers_are_not_part_of_the_opcode() -> None:
    instrs = functions(LISTING)["k"]
    assert [i.opcode for i in instrs[3:5]] == ["SYNCS", "BRA"]
    assert instrs[4].branch_target == 0xC0 and instrs[0].branch_target is None
    assert set(functions(LISTING)) == {"k", "other"}


def test_a_persistent_kernels_item_code_is_its_outer_loop_less_the_main_loop() -> None:
    # The outer loop 0x20-0xa0 spans the main loop; the retry stub's span 0x50-0xf0 holds EXIT and is not one.
    item = item_code(LISTING)
    assert item.persistent and (item.start, item.end) == (0x20, 0xA0)
    assert item.counts == {"UMOV": 1, "IADD3": 1, "BRA": 1} and item.conditional == 0


def test_an_outer_loop_holding_a_predicated_exit_is_still_the_loop_over_items() -> None:
    # The packed persistent walk (packed_order.h): ptxas copies the kernel's end to where the walk runs out of
    # items, a predicated EXIT inside the outer loop 0x10-0x90; the retry stub's span holds the plain EXIT.
    listing = """
        Function : k
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   VOTE.ANY R4, PT, P3 ;
        /*0020*/              @!P4 EXIT ;
        /*0030*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4+0x10], R0 ;
        /*0040*/              @!P0 BRA 0x00b0 ;
        /*0050*/                   HGMMA.64x128x16.F32 R24, gdesc[UR8], RZ, !UPT ;
        /*0060*/                   MUFU.EX2 R3, R3 ;
        /*0070*/              @!P1 BRA 0x0030 ;
        /*0080*/                   IADD3 R2, R2, 0x1, RZ ;
        /*0090*/                   BRA 0x0010 ;
        /*00a0*/                   EXIT ;
        /*00b0*/                   YIELD ;
        /*00c0*/                   BRA 0x0030 ;
"""
    item = item_code(listing)
    assert item.persistent and (item.start, item.end) == (0x10, 0x90)
    assert item.counts == {"VOTE": 1, "EXIT": 1, "IADD3": 1, "BRA": 1}


def test_a_one_item_kernels_item_code_runs_from_its_last_set_up_loop_to_exit() -> None:
    listing = """
        Function : k
        /*0000*/                   S2R R0, SR_TID.X ;
        /*0010*/                   USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xf0 ;
        /*0020*/                   PLOP3.LUT P0, PT, PT, PT, UP0, 0x80, 0x0 ;
        /*0030*/              @!P0 BRA 0x0010 ;
        /*0040*/                   LDG.E R8, desc[UR50][R2.64] ;
        /*0050*/              @P0 BRA P1, 0x0080 ;
        /*0060*/                   FSEL R28, R28, -INF , P6 ;
        /*0070*/                   FSEL R29, R29, -INF , P6 ;
        /*0080*/                   HGMMA.64x128x16.F32 R24, gdesc[UR8], RZ, !UPT ;
        /*0090*/              @!P1 BRA 0x0080 ;
        /*00a0*/              @!P2 EXIT ;
        /*00b0*/                   STG.E desc[UR50][R4.64], R8 ;
        /*00c0*/                   EXIT ;
        /*00d0*/                   BRA 0x00d0 ;
"""
    item = item_code(listing)
    assert not item.persistent and (item.start, item.end) == (0x40, 0xC0)
    assert item.total == 7 and item.conditional == 2  # the two FSEL under the branch with two predicates


def test_a_kernel_without_tensor_core_loops_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no loop with tensor-core instructions in other"):
        main_loop(LISTING, "other")


# Static instructions per main-loop iteration reached, the R2UR each loop may keep, the kernel function's whole
# static size (the epilogue's O store, per chunk ~45 instructions before session 19, now ~8), and the consumer's
# per-item code (item_code: once per work item outside the main loop).
# Session 22 (issue 37, per-item code; loop counts hold the masked path too): a masked tile one compare per
# element (-64 causal, -32 dense, static only on masked tiles), an item's first tile without a running max,
# the epilogue's rcp/lg2 without denormal fix-ups, one decode per one-item CTA, unsigned tile counts and lane.
# Per item then: 987, 862, 1225, 1057, 1141, 1110, 1035.
# Session 21: each stage's K and V descriptors made once and selected per tile, tile j - 1's slot and phase
# derived from tile j's (-14 to -18; D256 -2 with one more R2UR): 573, 533, 532, 642, 708, 643, 567.
# Session 20: 592, 551, 536, 659, 726, 660, 603.
# Session 19: the 16-bit loops rotated so that their softmax overlaps P V (+5 each), the ring's slot and
# phase unsigned (-3 to -6). Session 18 (sm_90a, nvcc 13.0): 606, 569, 541, 676, 743, 677, 599 (before it:
# 630, 581, 584, 704, 765, 706, 613). At D256 ptxas keeps five loop-invariant values (descriptor words and
# the tile bound) in ordinary registers, out of uniform registers (32 R2UR before session 18).
# Session 23: TWO_P (_2p, two P register sets, the loop unrolled by two; figures per tile): the F2FP among the
# exp2s, none before Q K^T's issue; +5 to +7.5 a tile (D256 +24) and +33 to +36 a work item (D256 -8).
# Session 25 (issue 37, packed persistent): only the real items, longest first, dealt in a snake, walked with warp
# ballots (attn_fwd_wgmma/packed_order.h): its variants' per-item code holds the walk (before: 593 a tile, 2344,
# 1012 with a unit decode; the outer loop over items now holds a predicated EXIT, which item_code allows).
# Session 26 (issue 37, packed persistent): the Q loader posts each item to the consumers in shared memory
# (attn_fwd_wgmma/item_mail.h), so no walk state is held across their loop (with it, R2UR in the loop: D64 m128n64 4,
# D256 24, one consumer 16); D256 packed persistent makes its Q descriptor each tile. Before: 596, 2888, 1075 (the
# measured row, +4 a tile on masked tiles only); D64 n64 345 (4 R2UR), 2272, 718; D256 553 (24), 3232, 1252; one
# consumer 611 (16), 2784, 1023.
REACHED: dict[str, tuple[float, int, int, int]] = {
    "attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_p_causal_packed": (600, 0, 2784, 916),
    "attn_fwd_wgmma_d64_fp16_m128n64_s3_sw64_r24_ov_pp_p_causal_packed": (357, 0, 2208, 581),
    "attn_fwd_wgmma_d256_bf16_m128n80_s2_sw128_r24_ov_pp_p_causal_packed": (565, 0, 3040, 1018),
    "attn_fwd_wgmma_d128_bf16_m64n128_s2_sw128_r24_ov_p_causal_packed": (603, 0, 2664, 873),
    "attn_fwd_wgmma_d128_fp16_m128n128_s2_sw128_r24_ov_pp_2p": (551.5, 0, 2376, 936),
    "attn_fwd_wgmma_d64_fp16_m128n128_s2_sw128_r24_ov_pp_2p": (509, 0, 2128, 811),
    "attn_fwd_wgmma_d256_fp16_m128n80_s2_sw128_r24_ov_pp_2p": (538, 9, 2648, 1153),
    "attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_2p_causal": (588, 0, 2496, 975),
    "attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_2p_causal_wl4096": (653, 0, 2712, 1052),
    "attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_2p_causal_packed": (582.5, 0, 2528, 996),
    "attn_fwd_wgmma_d128_fp16_m128n128_s2_sw128_r24_ov_pp": (544, 0, 1784, 902),
    "attn_fwd_wgmma_d64_fp16_m192n128_s2_sw128_r32_ov_pp": (504, 0, 1608, 784),
    "attn_fwd_wgmma_d256_fp16_m128n80_s2_sw128_r24_ov_pp": (514, 5, 2096, 1161),
    "attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_causal": (582, 0, 1864, 941),
    "attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_causal_wl4096": (646, 0, 2016, 1020),
    "attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_causal_packed": (578, 0, 1904, 960),
    "attn_fwd_wgmma_d128_e4m3_m128n128_s2_sw128_r24_ov_pp": (539, 0, 1776, 946),
}


@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize("name", sorted(REACHED))
def test_main_loop_stays_within_its_instruction_budget(name: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """No R2UR (the shared-memory descriptors on the uniform datapath, the warpgroup index provably
    warp-uniform) and no YIELD in the main loop, and no more than 2% over the instructions per tile, and over
    the kernel's whole size, and over the consumer's per-item code, that this revision reached."""
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    code = sass(compile_clean(name).cubin, tmp_path)
    loop = main_loop(code, name)
    total, r2ur, function_total, item_total = REACHED[name]
    assert loop.counts["R2UR"] <= r2ur, loop.counts
    assert loop.counts["YIELD"] == 0, loop.counts
    assert loop.per_tile(loop.total) <= total * 1.02, (loop.total, loop.tiles, total, loop.counts)
    assert loop.tiles == (2 if "_2p" in name else 1)
    assert len(functions(code)[loop.function]) <= function_total * 1.02
    item = item_code(code, name)
    assert item.total <= item_total * 1.02, (item.total, item_total, item.counts)


# The exp2 of a 16-bit loop run while the tensor cores do the P V issued before them (the loop rotated,
# consumer_mainloop.h ROTATED); before session 19, ptxas hoisted the P V wait above all of them (0 of 66).
# An e4m3 tile keeps the unrotated order (measured faster there).
OVERLAPPED = {name: name.split("_")[4] != "e4m3" for name in REACHED}


@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize("name", sorted(REACHED))
def test_the_softmax_overlaps_the_tensor_cores_p_v(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    overlapped, total = exp2_under_pv(sass(compile_clean(name).cubin, tmp_path), name)  # wgmma not serialised
    assert total >= parse_variant_name(name).params["BLOCK_N"] // 2 + 2  # a tile's exp2s and two corrections
    assert overlapped == (total if OVERLAPPED[name] else 0), (overlapped, total)


@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize("name", ["attn_fwd_wgmma_d128_fp16_m128n128_s2_sw128_r24_ov_pp",
                                  "attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_causal"])
def test_two_p_sets_take_the_p_conversions_off_the_q_k_issue(name: str, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The rotated loop converts P between its wait for P V and Q K^T's issue (s is Q K^T's destination);
    with two P sets (TWO_P) S is converted after its softmax, none there."""
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    twin = name.replace("_ov_pp", "_ov_pp_2p")
    assert f2fp_after_full_wait(sass(compile_clean(name).cubin, tmp_path), name) == 128 // 4
    code = sass(compile_clean(twin).cubin, tmp_path)
    assert f2fp_after_full_wait(code, twin) == 0
    assert main_loop(code, twin).counts["F2FP"] == 2 * 128 // 4


def test_f2fp_after_full_wait_stops_at_the_next_tensor_core_instruction() -> None:
    body = """
        Function : k
        /*0000*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0010*/                   F2FP.F16.F32.PACK_AB R3, R4, R3 ;
        /*0020*/                   HGMMA.64x128x16.F32 R24, gdesc[UR8], RZ, !UPT, gsb0 ;
        /*0030*/                   F2FP.F16.F32.PACK_AB R5, R6, R5 ;
        /*0040*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*0050*/                   F2FP.F16.F32.PACK_AB R7, R8, R7 ;
        /*0060*/                   HGMMA.64x128x16.F32 R24, gdesc[UR8], RZ, !UPT, gsb0 ;
        /*0070*/              @!P1 BRA 0x0000 ;
        /*0080*/                   EXIT ;
"""
    assert f2fp_after_full_wait(body) == 1
    assert main_loop(body).tiles == 2  # two Q K^T first steps (an accumulator overwritten): two tiles


def test_exp2_under_pv_counts_the_exp2_after_the_s_wait_only() -> None:
    body = """
        Function : k
        /*0000*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0010*/                   HGMMA.64x128x16.F32 R24, gdesc[UR8], RZ, !UPT, gsb0 ;
        /*0020*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*0030*/                   MUFU.EX2 R3, R3 ;
        /*0040*/                   MUFU.EX2 R4, R4 ;
        /*0050*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0060*/                   MUFU.EX2 R5, R5 ;
        /*0070*/              @!P1 BRA 0x0000 ;
        /*0080*/                   EXIT ;
"""
    assert exp2_under_pv(body) == (2, 3)
