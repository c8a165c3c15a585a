"""The decode template's instruction budget (issue 37 item 3): its main loop split into what every tile runs and
the conditional blocks (thread 0's refill, the paged path, the partial tile's mask, the last tile's zeroed V
rows), found in the SASS; and held where this revision brought it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kernel_builds import compile_clean, needs_nvcc, sass
from tuner.kernels.decode_budget import MASK, PAGE_READS, PAGED, REFILL, ZERO_V, decode_budget, label
from tuner.kernels.sass_budget import Instr

# A cut-down decode loop: the wait, a last-tile block (a signed division, a store of zeros), the S mma, a mask
# block, thread 0's refill holding the paged path (table read, copy), its dense copy, the back branch; EXIT
# and the wait's retry stub after it.
LISTING = """
        Function : k
        /*0000*/                   S2R R0, SR_TID.X ;
        /*0010*/                   I2F.U32.RP R9, R8 ;
        /*0020*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R14+UR15+0x11000], R13 ;
        /*0030*/              @!P0 BRA 0x01c0 ;
        /*0040*/              @!P1 BRA 0x0090 ;
        /*0050*/                   IABS R54, R12 ;
        /*0060*/                   I2F.RP R55, R54 ;
        /*0070*/                   MUFU.RCP R55, R55 ;
        /*0080*/                   STS.128 [R55+UR15], RZ ;
        /*0090*/                   HMMA.16816.F32.BF16 R52, R100, R108, RZ ;
        /*00a0*/              @!P2 BRA 0x00c0 ;
        /*00b0*/                   FSEL R12, R12, -INF , !P6 ;
        /*00c0*/              @P3 BRA 0x0180 ;
        /*00d0*/                   SYNCS.ARRIVE.TRANS64 RZ, [R53+UR9+0x10000], R52 ;
        /*00e0*/              @!P4 BRA 0x0130 ;
        /*00f0*/                   LDG.E R54, desc[UR30][R12.64] ;
        /*0100*/                   R2UR UR29, R54 ;
        /*0110*/                   UTMALDG.4D [UR24], [UR40] ;
        /*0120*/                   BRA 0x0170 ;
        /*0130*/                   UMOV UR17, UR25 ;
        /*0140*/                   UTMALDG.4D [UR16], [UR38] ;
        /*0150*/                   UTMALDG.4D [UR16], [UR38] ;
        /*0160*/                   NOP ;
        /*0170*/                   NOP ;
        /*0180*/                   UIADD3 UR32, UR32, 0x1, URZ ;
        /*0190*/              @!P5 BRA 0x0020 ;
        /*01a0*/                   STG.E desc[UR50][R4.64], R8 ;
        /*01b0*/                   EXIT ;
        /*01c0*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R14+UR15+0x11000], R13 ;
        /*01d0*/              @!P0 BRA 0x01c0 ;
        /*01e0*/                   BRA 0x0040 ;
"""


def test_the_loop_splits_into_every_tiles_code_and_named_blocks() -> None:
    budget = decode_budget(LISTING)
    assert (budget.loop.start, budget.loop.end) == (0x20, 0x190)
    assert [(b.label, b.start, b.end) for b in budget.blocks] == [
        (ZERO_V, 0x50, 0x80), (MASK, 0xB0, 0xB0), (REFILL, 0xD0, 0x170)]
    refill = budget.blocks[2]
    assert [(b.label, b.start, b.end) for b in refill.children] == [(PAGED, 0xF0, 0x120)]
    assert refill.own == {"SYNCS": 1, "BRA": 1, "UMOV": 1, "UTMALDG": 2, "NOP": 2}  # the dense copies
    assert budget.every_tile == {"SYNCS": 1, "BRA": 5, "HMMA": 1, "UIADD3": 1}
    assert sum(budget.every_tile.values()) + sum(b.total for b in budget.blocks) == budget.loop.total


def test_divisions_are_counted_in_the_loop_and_per_call() -> None:
    budget = decode_budget(LISTING)
    assert (budget.loop_divisions, budget.loop_signed) == (1, 1)
    assert (budget.call_divisions, budget.call_signed) == (1, 0)  # the unsigned one before the loop
    assert sum(budget.prologue.values()) == 2 and budget.epilogue == {"STG": 1, "EXIT": 1}  # no retry stub


def test_blocks_are_named_by_what_they_hold() -> None:
    reads = [Instr(0x0, "IMAD.U32 R52, RZ, RZ, UR14"), Instr(0x10, "@!P3 LDG.E R10, desc[UR46][R56.64]")]
    assert label(reads) == PAGE_READS  # the next refill's table entries, read ahead
    assert label(reads + [Instr(0x20, "UTMALDG.4D [UR16], [UR38]")]) == PAGED
    assert label([Instr(0x0, "IADD3 R1, R1, 0x1, RZ")]) == "other"


# Static instructions reached (session 25, sm_90a, nvcc 13.0): the main loop, what every tile runs on every warp
# (the loop less its conditional blocks), and the per-call code before and after the loop. Before (main at
# 477bfbe): loop 1018, 1080, 1052, 1087; every tile 316, 319, 485, 391; before the loop 1198, 1266, 1113,
# 1235; after it 599, 599, 1144, 1669; 5 (6 causal) runtime divisions and 23 (26) IABS in the loop. The steps:
# the last tile's V rows zeroed without dividing by the row count (its block 313 -> 20), the packed rows' and
# the tile counts' divisions unsigned, the prologue's ring fill not unrolled, the ring's slot and phase advanced
# with the tile, a K/V address one XOR on the lane's base, the FP8 merge in 16-byte pieces, the warps' merge in
# two copies of the code (not one a warp): 704, 757, 748, 770; 298, 303, 475, 374; 842, 895, 865, 877; 594, 594,
# 663, 1232. Then a paged refill's first table entries read before the tile's math (their latency hidden under
# it, not on the CTA's path): +58 in the loop (thread 0's warp, paged only), +6 to +9 a tile on every warp.
REACHED: dict[str, tuple[int, int, int, int]] = {
    "attn_decode_d128_bf16_m16n64_w2_sp2_s2": (765, 306, 916, 595),  # the B8 Sk8192 bf16 winner
    "attn_decode_d128_bf16_m16n64_w2_sp2_s2_causal": (822, 313, 970, 595),
    "attn_decode_d128_bf16_kv_e4m3_m16n128_w4_sp2_s2": (803, 481, 915, 663),  # the FP8-cache winner
    "attn_decode_d128_bf16_m32n64_w4_sp8_s2": (834, 383, 951, 1233),  # the page-16 winner
}


@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize("name", sorted(REACHED))
def test_the_decode_loop_stays_within_its_instruction_budget(name: str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """No signed division in the loop (a causal mask keeps one unsigned division of the row index by the
    group, on partial tiles only), no YIELD, and no more than 2% over what this revision reached: the loop,
    every tile's code, and the per-call code on either side of it."""
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    budget = decode_budget(sass(compile_clean(name).cubin, tmp_path), name)
    loop, every_tile, before, after = REACHED[name]
    assert budget.loop_signed == 0, budget.loop.counts
    assert budget.loop_divisions == (1 if name.endswith("_causal") else 0), budget.loop.counts
    assert budget.loop.counts["YIELD"] == 0 and budget.call_signed == 0
    assert budget.loop.total <= loop * 1.02, (budget.loop.total, loop)
    assert sum(budget.every_tile.values()) <= every_tile * 1.02, budget.every_tile
    assert sum(budget.prologue.values()) <= before * 1.02, budget.prologue
    assert sum(budget.epilogue.values()) <= after * 1.02, budget.epilogue
    assert [b.label for b in budget.blocks] == [ZERO_V, PAGE_READS, MASK, REFILL]
    assert [b.label for b in budget.blocks[3].children] == [PAGED]
    assert budget.blocks[0].total <= 30  # the last tile's zeroing: a short loop, no division
