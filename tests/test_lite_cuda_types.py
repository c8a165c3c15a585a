"""The tuner compiles with -DFC_LITE_CUDA_TYPES (kernel_templates/common/cuda_types.h declares the few CUDA element
types and conversions the templates use instead of the toolkit's cuda_fp16.h, cuda_bf16.h and cuda_fp8.h): the
cubin must be the very bytes the toolkit headers give, and the heavy headers must really stay out.

Needs nvcc (no GPU)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tuner.kernels import compiler
from tuner.kernels.compiler import BASE_OPTIONS, arch_flags, compile_source
from tuner.kernels.manifest import template_folders
from tuner.kernels.render import render
from tuner.kernels.variant import parse_variant_name

pytestmark = [
    pytest.mark.nvcc,
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH (CUDA toolkit not installed)"),
]
LITE = "-DFC_LITE_CUDA_TYPES"
# One variant per use of a lite definition: half/bf16 packing (every template), e4m3 packing (FP8 forward),
# __half22float2 and __bfloat1622float2 with the decode's cluster merge (FP8 KV caches, SPLITS > 1),
# operator float() of half and bf16 (both backward templates, bf16 also on sm_80's path), and their float
# constructors (the backward's dQ conversion, BLOCK_M 80).
VARIANTS = [
    ("attn_fwd_wgmma_d128_fp16_m128n128_s2_sw128_r24_ov_p", "sm_90a"),
    ("attn_fwd_wgmma_d64_bf16_m128n96_s3_sw128_r40_ov_p_2p_causal", "sm_90a"),
    ("attn_fwd_wgmma_d128_e4m3_m128n128_s4_sw128_r24_ov_pp", "sm_90a"),
    ("attn_decode_d128_bf16_kv_e4m3_m32n64_w4_sp1_s3", "sm_90a"),  # a defaulted bf16x2 copy moved code here
    ("attn_decode_d128_fp16_kv_e4m3_m16n128_w8_sp4_s3", "sm_90a"),
    ("attn_decode_sm80_d128_bf16_m16n64_w2_sp2_s3", "sm_80"),
    ("attn_fwd_mma_d64_bf16_m64n64_w2_kv2_none_s3_qreg_b2_causal", "sm_80"),
    ("attn_bwd_wgmma_d64_bf16_m64n64_s2_bulk_p_causal", "sm_90a"),
    ("attn_bwd_wgmma_d128_bf16_m80n128_s2_bulk_pw", "sm_90a"),
    ("attn_bwd_wgmma_d128_fp16_m80n128_s2_bulk_pw", "sm_90a"),
    ("attn_bwd_mma_d128_bf16_m32n64_w4_none_s1", "sm_80"),
    ("attn_bwd_mma_d64_fp16_m32n64_w4_none_s2_causal", "sm_90a"),
]


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))  # really run nvcc, never a stale cubin


@pytest.mark.parametrize(("name", "arch"), VARIANTS, ids=[name for name, _ in VARIANTS])
def test_lite_types_give_the_toolkit_headers_cubin(name: str, arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    source = render(parse_variant_name(name))
    assert LITE in BASE_OPTIONS
    lite = compile_source(source, name, arch)
    monkeypatch.setattr(compiler, "BASE_OPTIONS", tuple(o for o in BASE_OPTIONS if o != LITE))
    full = compile_source(source, name, arch)  # what a user's own build of the template gets
    assert lite.ok, lite.log[-2000:]
    assert full.ok, full.log[-2000:]
    assert not full.cached and lite.cubin_path != full.cubin_path  # two compiles, not one cache entry
    assert lite.cubin == full.cubin
    assert (lite.registers, lite.spill_bytes) == (full.registers, full.spill_bytes)


def _included(source: str, arch: str, options: tuple[str, ...], folder: Path) -> str:
    """The files nvcc's preprocessor reads for `source` (nvcc -M), with the templates folders included."""
    src = folder / "k.cu"
    src.write_text(source)
    includes = [arg for d in template_folders() for arg in ("-I", str(d))]
    cmd = ["nvcc", "-M", *[o for o in options if not o.startswith("--ptxas")], *arch_flags(arch), *includes, str(src)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


@pytest.mark.parametrize("name", ["attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_p",
                                  "attn_decode_d128_fp16_kv_e4m3_m16n128_w8_sp4_s3"])
def test_the_tuners_compile_reads_no_fp_or_cooperative_groups_header(name: str, tmp_path: Path) -> None:
    heavy = ("cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h", "cooperative_groups.h")
    source = render(parse_variant_name(name))
    lite = _included(source, "sm_90a", BASE_OPTIONS, tmp_path)
    assert "cuda_types.h" in lite and not [h for h in heavy if f"/{h}" in lite]
    full = _included(source, "sm_90a", tuple(o for o in BASE_OPTIONS if o != LITE), tmp_path)
    assert all(f"/{h}" in full for h in heavy[:3])  # the same source without the option: the toolkit's headers


def test_lite_types_refuse_a_toolkit_header_beside_them() -> None:
    """Both definitions of __half in one compile would be a redefinition error at best; the guard says why."""
    source = '#include <cuda_fp16.h>\n#include "common/utils.h"\nextern "C" __global__ void k(float* x) { x[0] = 1.f; }\n'
    res = compile_source(source, "k", "sm_90a")
    assert not res.ok and "a toolkit cuda_fp16/bf16/fp8 header is included too" in res.log
