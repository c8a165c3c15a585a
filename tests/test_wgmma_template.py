"""The Hopper template (attn_fwd_wgmma) without a GPU: manifest, feasibility, generated code, SASS.

The nvcc-marked tests compile for sm_90a locally and read the SASS with
cuobjdump: the kernels must really use wgmma (HGMMA), TMA (UTMALDG) and the
register split (USETMAXREG), and the tuned shapes must not spill.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.kernels.compiler import compile_many, compile_source
from tuner.kernels.feasibility import check, covering_sample, feasible_space, resources
from tuner.kernels.manifest import load_manifest
from tuner.kernels.render import render
from tuner.kernels.variant import enumerate_space, parse_variant_name
from tuner.problem import Problem
from tuner.profiles import load_profile
from tuner.runtime.build import launch_shape
from tuner.search.options import SearchOptions
from tuner.search.prepare import choose_template

TEMPLATE = "attn_fwd_wgmma"
SERIALIZED = "wgmma.mma_async instructions are serialized"  # ptxas's note (C75xx) when it gives up overlap
ROOT = Path(__file__).resolve().parent.parent
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH (CUDA toolkit not installed)")


def _generator():
    spec = importlib.util.spec_from_file_location("gen_wgmma_wrappers", ROOT / "tools" / "gen_wgmma_wrappers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_wgmma_wrappers_are_up_to_date() -> None:
    gen = _generator()
    source = gen.TEMPLATE.read_text()
    assert gen.splice(source) == source, "run: python tools/gen_wgmma_wrappers.py"


def test_every_tile_width_has_a_wgmma_wrapper() -> None:
    manifest = load_manifest(TEMPLATE)
    widths = set(_generator().WIDTHS)
    assert set(manifest.params["BLOCK_N"].values) <= widths  # the N of Q K^T
    assert set(manifest.features.head_dims) <= widths  # the N of P V


def test_only_sm90_profiles_can_run_it() -> None:
    problem = Problem(1, 2, 256, 256, 64)
    variant = next(iter(enumerate_space(TEMPLATE, problem)))
    why = check(variant, problem, load_profile("a100")).reason
    assert "compute capability 9.0" in why
    assert feasible_space(TEMPLATE, problem, load_profile("h100"))


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([64, 128]), st.booleans(), st.integers(0, 10_000))
def test_feasible_variants_respect_the_register_split_and_smem(head_dim: int, causal: bool, pick: int) -> None:
    profile = load_profile("h100")
    problem = Problem(2, 4, 1024, 1024, head_dim, causal=causal)
    pool = feasible_space(TEMPLATE, problem, profile)
    variant = pool[pick % len(pool)]
    res = resources(variant)
    consumers = variant.params["BLOCK_M"] // 64
    launch_regs = min(255, 65536 // res["threads"]) // 8 * 8
    if consumers > 1:  # setmaxnreg moves registers inside the CTA's own pool: more than it has would hang
        assert 128 * variant.params["PRODUCER_REGS"] + 128 * consumers * res["consumer_regs"] <= res["threads"] * launch_regs
    else:
        assert variant.params["PRODUCER_REGS"] == 24
    assert res["smem_bytes"] <= profile.smem_per_block_optin
    shape = launch_shape(variant)
    assert (shape.tma_swizzle, shape.tma_kv_rows, shape.tma_q_rows, shape.block_m) == (
        variant.params["SWIZZLE"], variant.params["BLOCK_N"], 64, variant.params["BLOCK_M"])
    assert head_dim % (variant.params["SWIZZLE"] // 2) == 0


def test_search_defaults_to_the_hopper_template_where_it_fits() -> None:
    def chosen(gpu: str, shape: str, template=None) -> str:
        options = SearchOptions(gpu=gpu, shapes=(shape,), template=template)
        return choose_template(options, load_profile(gpu))

    assert chosen("h100", "8,16,2048,128") == TEMPLATE
    assert chosen("h200", "16,16,2048,64") == TEMPLATE
    assert chosen("h100", "8,16,2048,96") == "attn_fwd_mma"  # D 96: only the sm_80 template has it
    assert chosen("a100", "8,16,2048,128") == "attn_fwd_mma"
    assert chosen("h100", "8,16,2048,128", template="attn_fwd_mma") == "attn_fwd_mma"


def _sass(cubin: bytes, tmp_path: Path) -> str:
    path = tmp_path / "k.cubin"
    path.write_bytes(cubin)
    return subprocess.run(["cuobjdump", "-sass", str(path)], capture_output=True, text=True, check=True).stdout


@pytest.mark.nvcc
@needs_nvcc
def test_covering_sample_compiles_to_wgmma_and_tma(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    profile = load_profile("h100")
    variants = []
    for head_dim, dtype, causal in [(64, "fp16", False), (128, "bf16", True)]:
        variants += covering_sample(TEMPLATE, Problem(1, 1, 128, 128, head_dim, dtype=dtype, causal=causal),
                                    profile, seed=head_dim)
    results = compile_many([(render(v), v.name, "sm_90a") for v in variants], workers=2)
    failures = [f"{v.name}:\n{r.log[-1500:]}" for v, r in zip(variants, results) if not r.ok]
    assert not failures, "\n".join(failures)
    serialized = [v.name for v, r in zip(variants, results) if SERIALIZED in r.log]
    assert not serialized, f"ptxas serialized the wgmma of {serialized}"
    if shutil.which("cuobjdump") is None:
        pytest.skip("cuobjdump not on PATH: SASS not checked")
    for variant, res in zip(variants[:4], results[:4]):
        sass = _sass(res.cubin, tmp_path)
        assert re.search(r"HGMMA\.64x\d+x16\.F32", sass), variant.name
        assert "UTMALDG.4D" in sass and "SYNCS.PHASECHK" in sass, variant.name
        assert ("USETMAXREG" in sass) == (variant.params["BLOCK_M"] > 64), variant.name


@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize("name", [
    "attn_fwd_wgmma_d64_fp16_m192n128_s2_sw128_r32_ov_pp",           # best measured, B16 H16 S2048 D64 (H100)
    "attn_fwd_wgmma_d128_fp16_m128n176_s2_sw128_r32_ov_pp",          # best measured, B8 H16 S2048 D128 (H100)
    "attn_fwd_wgmma_d64_fp16_m128n128_s2_sw128_r24_ov_pp_p_causal",  # best measured, D64 causal (H100)
    "attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_causal",
])
def test_tuned_shapes_do_not_spill_or_serialize(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No spills, and no wgmma serialization: ptxas silently gives up all tensor-core overlap
    (one wgmma at a time) when, e.g., it must insert a warpgroup fence in a divergent path."""
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    variant = parse_variant_name(name)
    res = compile_source(render(variant), name, "sm_90a")
    assert res.ok, res.log[-2000:]
    assert res.spill_bytes == 0 and res.stack_bytes == 0, (res.registers, res.spill_bytes, res.stack_bytes)
    assert SERIALIZED not in res.log, res.log[-2000:]


def test_a_newer_card_is_not_offered_the_sm90a_only_template(tmp_path: Path) -> None:
    from tuner.profiles import load_profile_file

    text = (ROOT / "profiles" / "h100.toml").read_text()
    text = text.replace('name = "h100"', 'name = "future"').replace("compute_capability = [9, 0]", "compute_capability = [10, 0]")
    text = text.replace('nvcc_arch = "sm_90a"', 'nvcc_arch = "sm_100a"')
    path = tmp_path / "future.toml"
    path.write_text(text)
    profile = load_profile_file(path)
    assert profile.compute_capability == (10, 0)
    problem = Problem(1, 2, 256, 256, 64)
    variant = next(iter(enumerate_space(TEMPLATE, problem)))
    assert "built for sm_90a, not sm_100a" in check(variant, problem, profile).reason
