"""Packed sequences (layout "packed") as the tuner sees them before a GPU: which templates and variants take
them, how a packed variant is named, stored and rendered, and how it is launched."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.errors import TunerError
from tuner.kernels.feasibility import check, covering_sample, feasible_space, supports_problem
from tuner.kernels.manifest import load_manifest
from tuner.kernels.render import render
from tuner.kernels.variant import Variant, parse_variant_name, variant_from_params
from tuner.problem import Problem
from tuner.profiles import load_profile
from tuner.runtime.build import launch_shape

from tests.kernel_builds import compile_clean, needs_nvcc, sass

H100 = load_profile("h100")
PACKED = Problem(16, 32, 4096, 4096, 128, "bf16", causal=True, heads_kv=8, layout="packed", lengths="uniform:64")
DENSE = Problem(1, 32, 4096, 4096, 128, "bf16", causal=True, heads_kv=8, layout="bshd")


def test_only_the_hopper_prefill_template_takes_packed_sequences() -> None:
    assert supports_problem(load_manifest("attn_fwd_wgmma"), PACKED) == ""
    for name in ("attn_fwd_mma", "attn_decode", "attn_decode_sm80"):
        assert "layout packed unsupported" in supports_problem(load_manifest(name), PACKED)


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_a_packed_variant_names_itself_and_reads_back(data: st.DataObject) -> None:
    variants = feasible_space("attn_fwd_wgmma", PACKED, H100)
    variant = data.draw(st.sampled_from(variants))
    assert variant.packed and variant.name.endswith("_causal_packed")
    assert parse_variant_name(variant.name) == variant
    assert Variant.from_stored(variant.template, variant.stored_params()) == variant
    assert variant.stored_params()["packed"] is True


def test_packed_and_dense_variants_are_different_kernels() -> None:
    dense = covering_sample("attn_fwd_wgmma", DENSE, H100, seed=0)[0]
    packed = variant_from_params("attn_fwd_wgmma", PACKED, dense.params)
    assert dense != packed and dense.name + "_packed" == packed.name
    assert "packed" not in dense.stored_params()  # a dense variant's stored identity is as before packing
    assert not check(dense, PACKED, H100) and "packed" in check(dense, PACKED, H100).reason
    assert not check(packed, DENSE, H100)
    assert check(packed, PACKED, H100)
    # Rendered with the packed entry point (cumulative lengths after the descales) and launched so.
    source = render(packed)
    assert "(ATTN_FWD_PARAMS_PACKED)" in source and "ATTN_FWD_BODY_PACKED(TunerCfg)" in source
    assert "fc::NoMask, true, false>" in source and "fc::NoMask, false, false>" in render(dense)
    assert launch_shape(packed).packed and not launch_shape(dense).packed


def test_a_packed_variant_of_a_template_without_packing_is_refused() -> None:
    mma = covering_sample("attn_fwd_mma", DENSE, H100, seed=0)[0]
    with pytest.raises(TunerError, match="^attn_fwd_mma: packed sequences unsupported$"):
        parse_variant_name(mma.name + "_packed")
    with pytest.raises(TunerError, match="^attn_fwd_mma: packed sequences unsupported$"):
        Variant.from_stored("attn_fwd_mma", {**mma.stored_params(), "packed": True})


@given(st.lists(st.integers(0, 5000), min_size=1, max_size=40), st.sampled_from([64, 128, 192]),
       st.booleans())
def test_a_packed_grid_has_a_cta_for_every_query_tile_of_every_sequence(lengths: list[int], block_m: int,
                                                                       persistent: bool) -> None:
    from tuner.runtime.shipped.launcher import LaunchShape, launch_grid

    shape = LaunchShape(block_m, 128 * (block_m // 64 + 1), 1024, 128, 128, 64, persistent, packed=True)
    longest = max(max(lengths), 1)  # max_seqlen_q
    x, y, z = launch_grid(shape, len(lengths), 32, 8, longest, 132)
    if persistent:  # units of the longest sequence's tiles, strided over at most one CTA per SM
        assert x * y * z <= 132
    else:  # one CTA per (query tile of the longest, head, sequence); a shorter sequence's extra CTAs exit
        assert (y, z) == (32, len(lengths)) and x * block_m >= max(lengths)


def test_a_packed_launch_checks_its_inputs_with_one_line_errors() -> None:
    import torch

    from tuner.runtime.shipped.input_checks import check_packed_inputs
    from tuner.runtime.shipped.launcher import AttentionInputError

    q, k = torch.zeros(10, 4, 64, dtype=torch.bfloat16), torch.zeros(10, 2, 64, dtype=torch.bfloat16)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    cases = [((q, k, k, q, cu, cu, 0, 6), r"^max_seqlen_q must be a positive int \(got 0\)$"),
             ((q, k, k, q, cu, cu[:2], 6, 6), r"^cu_seqlens_q and cu_seqlens_k must have one length"),
             ((q, k, k, q, cu.long(), cu, 6, 6), r"^cu_seqlens_q must be an int32 tensor \[B \+ 1\]"),
             ((q, k, k[:, :, :32], q, cu, cu, 6, 6), r"^packed k and v must be \[total_k, Hkv, D\]"),
             ((q, k, k, q[None], cu, cu, 6, 6), r"^packed out must be a rank-3 tensor"),
             ((q, k, k, q, cu, cu, 6, 6), r"^q must be a CUDA tensor")]  # CPU tensors: only after the structure
    for args, message in cases:
        with pytest.raises(AttentionInputError, match=message):
            check_packed_inputs(*args)


@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize("name", [
    "attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_causal_packed",        # best measured packed (H100)
    "attn_fwd_wgmma_d64_fp16_m128n64_s3_sw64_r24_ov_pp_p_causal_packed",         # persistent
    "attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_causal_wl100_packed",  # window
    "attn_fwd_wgmma_d256_bf16_m128n80_s2_sw128_r24_ov_causal_sc30_packed",       # softcap, D256
])
def test_packed_kernels_keep_the_dense_main_loop(name: str, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sequence offsets must not cost the main loop its shape: no spills, no serialized wgmma, and the SASS
    still has wgmma (HGMMA), TMA loads (UTMALDG) and the producer/consumer register split."""
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    text = sass(compile_clean(name).cubin, tmp_path)
    assert re.search(r"HGMMA\.64x\d+x16\.F32", text) and "UTMALDG" in text and "USETMAXREG" in text
