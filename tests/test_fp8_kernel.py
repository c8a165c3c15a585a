"""The Hopper template's FP8 (e4m3) path without a GPU: what the launcher is told, the descale and tensor
checks, and the compiled code (QGMMA k32 for both products, V's transpose kernel in the same cubin)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tests.kernel_builds import compile_clean, needs_nvcc, sass
from tuner.kernels.feasibility import feasible_space
from tuner.kernels.variant import parse_variant_name
from tuner.problem import Problem
from tuner.profiles import load_profile
from tuner.runtime.build import launch_shape
from tuner.runtime.shipped.fp8 import VTransposer, check_descales
from tuner.runtime.shipped.launcher import AttentionInputError, check_attention_tensors

FP8_NAMES = [
    "attn_fwd_wgmma_d128_e4m3_m128n192_s2_sw64_r24_ov_pp",          # best measured, D128 (H100)
    "attn_fwd_wgmma_d128_e4m3_m128n128_s2_sw128_r24_ov_pp_causal",
    "attn_fwd_wgmma_d256_e4m3_m128n128_s2_sw128_r24_ov_pp",         # best measured, D256 (H100)
    "attn_fwd_wgmma_d64_e4m3_m192n128_s2_sw64_r24_ov_pp",
]


def test_e4m3_kernels_take_descales_and_read_v_transposed() -> None:
    fp8 = launch_shape(parse_variant_name(FP8_NAMES[0]))
    bf16 = launch_shape(parse_variant_name("attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp"))
    assert fp8.fp8 and fp8.descales
    assert bf16.descales and not bf16.fp8  # every Hopper kernel takes the (null) descale pointers
    decode = launch_shape(parse_variant_name("attn_decode_d128_bf16_m16n64_w4_sp4_s3"))
    assert decode.descales and not decode.fp8 and not decode.kv_fp8  # the sm_90 decode kernels take them too
    cache = launch_shape(parse_variant_name("attn_decode_d128_bf16_kv_e4m3_m16n64_w4_sp4_s3"))
    assert cache.descales and cache.kv_fp8 and not cache.fp8
    assert not launch_shape(parse_variant_name("attn_decode_sm80_d128_bf16_m16n64_w4_sp4_s3")).descales


def test_fp8_tiles_fit_the_transposed_v_box() -> None:
    """V^T's box is SWIZZLE bytes of keys wide: an e4m3 key tile is a whole number of boxes, and the head
    dim a whole number of Q/K boxes (SWIZZLE elements each)."""
    pool = feasible_space("attn_fwd_wgmma", Problem(1, 2, 1024, 1024, 128, dtype="e4m3"), load_profile("h100"))
    assert pool
    for v in pool:
        assert v.params["BLOCK_N"] % v.params["SWIZZLE"] == 0 and 128 % v.params["SWIZZLE"] == 0, v.name


def _cpu(shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype)


def test_descales_are_float32_batch_by_kv_heads() -> None:
    q, k = _cpu((2, 8, 16, 64), torch.float8_e4m3fn), _cpu((2, 4, 16, 64), torch.float8_e4m3fn)
    good = tuple(torch.ones(2, 4) for _ in range(3))
    check_descales(q, k, good)  # no error
    check_descales(q, k, (None, good[1], good[2]), kv_only=True)  # an FP8 cache's: no q_descale
    with pytest.raises(AttentionInputError, match=r"FP8 KV-cache kernels take descales=\(None, k_scale, v_scale\)"):
        check_descales(q, k, good, kv_only=True)
    with pytest.raises(AttentionInputError, match=r"v_scale must be a contiguous float32 tensor of shape \(2, 4\)"):
        check_descales(q, k, (None, good[1], torch.ones(4)), kv_only=True)
    with pytest.raises(AttentionInputError, match=r"descales=\(q_descale, k_descale, v_descale\)"):
        check_descales(q, k, None)
    with pytest.raises(AttentionInputError, match=r"k_descale must be a contiguous float32 tensor of shape \(2, 4\)"):
        check_descales(q, k, (good[0], torch.ones(2, 8), good[2]))
    with pytest.raises(AttentionInputError, match="v_descale must be"):
        check_descales(q, k, (good[0], good[1], torch.ones(2, 4, dtype=torch.float64)))


def test_fp8_tensors_need_16_byte_strides_and_a_bf16_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))  # the checks after the device's
    q = _cpu((1, 2, 32, 64), torch.float8_e4m3fn)
    out = _cpu((1, 2, 32, 64), torch.bfloat16)
    check_attention_tensors(q, q, q, out)
    with pytest.raises(AttentionInputError, match="out must be"):
        check_attention_tensors(q, q, q, _cpu((1, 2, 32, 64), torch.float8_e4m3fn))
    with pytest.raises(AttentionInputError, match="v must be float16, bfloat16 or float8_e4m3fn like q"):
        check_attention_tensors(q, q, _cpu((1, 2, 32, 64), torch.bfloat16), out)
    odd = _cpu((1, 2, 32, 72), torch.float8_e4m3fn)[..., :64]  # row stride 72 bytes
    with pytest.raises(AttentionInputError, match="multiples of 16 elements"):
        check_attention_tensors(odd, odd, odd, out)


@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize("name", FP8_NAMES)
def test_fp8_variants_compile_to_qgmma_without_spills(name: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    text = sass(compile_clean(name).cubin, tmp_path)
    assert re.search(r"QGMMA\.64x\d+x32\.F32\.E4M3\.E4M3", text)
    assert not re.search(r"HGMMA", text)  # both products in FP8
    assert "F2FP.SATFINITE.E4M3.F32.PACK_AB" in text  # P rounded to e4m3 in registers
    assert f"Function : {VTransposer.ENTRY}" in text  # the launcher's V^T pass, from the same cubin
