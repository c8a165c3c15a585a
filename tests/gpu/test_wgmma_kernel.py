"""The Hopper TMA/wgmma template on a real sm_90 GPU: every output element right, every variant kind."""

from __future__ import annotations

import pytest

from tests.gpu.reference_checks import assert_sanitizer_clean, assert_variants_match_reference, sample_variants
from tuner.kernels.variant import parse_variant_name
from tuner.problem import Problem

pytestmark = pytest.mark.gpu
TEMPLATE = "attn_fwd_wgmma"

PROBLEMS = [
    Problem(2, 4, 256, 256, 64),
    Problem(1, 2, 1, 1, 64),                                   # S = 1
    Problem(1, 2, 17, 17, 128),                                # tails smaller than any tile
    Problem(1, 2, 1000, 1000, 128, dtype="bf16"),              # tails, bf16
    Problem(1, 2, 100, 300, 64, causal=True),                  # causal, Sq < Sk (bottom-right)
    Problem(1, 2, 300, 100, 64, causal=True),                  # causal, Sq > Sk: rows that see no key
    Problem(2, 8, 257, 257, 64, heads_kv=2),                   # GQA
    Problem(2, 4, 200, 190, 128, layout="bshd"),               # BSHD strides
    Problem(1, 4, 513, 513, 128, dtype="bf16", causal=True),   # bf16 causal D 128
    Problem(1, 3, 700, 1100, 64, dtype="bf16", heads_kv=1, layout="bshd"),  # MQA, BSHD, long tails
    Problem(1, 4, 333, 333, 96),                               # D 96: three 32-column blocks at sw64
    Problem(1, 4, 300, 500, 96, dtype="bf16", causal=True, heads_kv=2),   # D 96 causal GQA
    Problem(1, 2, 257, 257, 192, dtype="bf16"),                # D 192
    Problem(1, 2, 300, 300, 256),                              # D 256: a 64 x 256 O per warpgroup
    Problem(2, 4, 190, 400, 256, dtype="bf16", causal=True, heads_kv=1, layout="bshd"),  # D 256 causal MQA BSHD
    # Sliding windows: tiles left of the window skipped, partial tiles masked on both sides.
    Problem(1, 2, 600, 600, 128, dtype="bf16", causal=True, window_left=100),  # window narrower than a tile
    Problem(1, 4, 1000, 1000, 64, causal=True, window_left=256, heads_kv=2),  # GQA
    Problem(1, 2, 300, 700, 128, window_left=50, window_right=30),  # both sides, Sq < Sk
    Problem(1, 2, 500, 300, 64, causal=True, window_left=64),  # Sq > Sk: rows that see no key
    Problem(1, 2, 400, 400, 128, window_left=0, window_right=0, layout="bshd"),  # each query its own key only
    # Logit softcapping, alone and with a window.
    Problem(1, 2, 257, 257, 256, dtype="bf16", causal=True, softcap=50.0),
    Problem(2, 4, 300, 300, 128, dtype="bf16", layout="bshd", softcap=5.0),  # strong capping
    Problem(1, 4, 700, 700, 96, causal=True, window_left=200, softcap=30.0, heads_kv=2),
    # FP8 (e4m3): V transposed by the launcher (tails past a multiple of 16 keys), descales per (batch, K/V head).
    Problem(2, 4, 1000, 1000, 128, dtype="e4m3"),
    Problem(2, 8, 777, 1500, 128, dtype="e4m3", causal=True, heads_kv=2),
    Problem(1, 4, 300, 200, 64, dtype="e4m3", causal=True, layout="bshd"),  # rows that see no key
    Problem(1, 2, 257, 257, 256, dtype="e4m3", heads_kv=1),
    Problem(1, 4, 333, 333, 96, dtype="e4m3"),
    Problem(1, 4, 600, 600, 128, dtype="e4m3", causal=True, window_left=100, softcap=30.0, heads_kv=2),
]


def test_v_transpose_puts_the_keys_in_p_fragment_order(hopper) -> None:
    """fc_v_transpose_e4m3 against torch's permute of the same bytes: V [B, Hkv, Sk, D] (BHSD or BSHD
    strides) to V^T [B, Hkv, D, Sk rounded up to 16], the keys of every 16 as 0 1 8 9 2 3 10 11 ..., zeros
    past Sk."""
    import torch

    from tuner.kernels.variant import parse_variant_name
    from tuner.runtime.build import build
    from tuner.runtime.shipped.fp8 import VTransposer

    built = build(parse_variant_name("attn_fwd_wgmma_d128_e4m3_m128n128_s2_sw128_r24_ov_pp"), hopper.nvcc_arch)
    transpose = VTransposer(built.compiled.cubin, 0)
    for b, h, s, d in ((2, 3, 1000, 128), (1, 2, 77, 96), (2, 2, 4096, 256), (1, 1, 1, 64)):
        v = torch.randn(b, h, s, d, device="cuda").to(torch.float8_e4m3fn)
        s16 = -(-s // 16) * 16
        x = torch.nn.functional.pad(v.view(torch.uint8), (0, 0, 0, s16 - s))
        want = x.view(b, h, s16 // 16, 2, 4, 2, d).permute(0, 1, 6, 2, 4, 3, 5).reshape(b, h, d, s16)
        assert torch.equal(transpose(v).view(torch.uint8), want)
        bshd = v.transpose(1, 2).contiguous().transpose(1, 2)
        assert torch.equal(transpose(bshd).view(torch.uint8), want)


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.label.replace(" ", "_") + "_" + p.layout)
def test_variants_match_fp32_reference(problem: Problem, hopper) -> None:
    assert_variants_match_reference(sample_variants(TEMPLATE, problem, hopper), problem, hopper)


# TWO_P (two P register sets, the loop unrolled by two): 1 to 5 key tiles of 128, so the last P is in either set
# and the pair's mid-loop exit is taken or not; causal rows whose tile counts differ by warpgroup; persistent CTAs
# running items one after another; a 3-stage ring (tile j - 1's slot not tile j's other one).
TWO_P_PROBLEMS = [Problem(1, 2, 200, sk, 128) for sk in (100, 200, 300, 500, 600)] + [
    Problem(2, 4, 700, 700, 128, dtype="bf16", causal=True)]


@pytest.mark.parametrize("problem", TWO_P_PROBLEMS, ids=lambda p: p.label.replace(" ", "_"))
def test_two_p_loop_matches_fp32_reference(problem: Problem, hopper) -> None:
    tail = "_2p" + ("_causal" if problem.causal else "")
    names = [f"attn_fwd_wgmma_d128_{problem.dtype}_m128n128_s2_sw128_r24_ov_pp{p}{tail}" for p in ("", "_p")]
    names.append(f"attn_fwd_wgmma_d128_{problem.dtype}_m128n128_s3_sw128_r24_ov{tail}")
    assert_variants_match_reference([parse_variant_name(n) for n in names], problem, hopper)


@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_compute_sanitizer_clean(tool: str, hopper) -> None:
    assert_sanitizer_clean(tool, "wgmma")
