"""Sliding windows and logit softcap as problem features: the problem's rules and pair count, variant
names that read back, feasibility by template, the store, and the rendered mask compiling (nvcc, no GPU)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.errors import TunerError
from tuner.kernels.feasibility import check, covering_sample, supports_problem
from tuner.kernels.manifest import load_manifest
from tuner.kernels.render import mask_type, render
from tuner.kernels.variant import parse_variant_name, variant_from_params
from tuner.problem import Problem, parse_window, window_pairs, window_text
from tuner.profiles import load_profile

TEMPLATES = ("attn_fwd_mma", "attn_fwd_wgmma", "attn_decode", "attn_decode_sm80")


def brute_pairs(sq: int, sk: int, left: int, right: int, causal: bool) -> int:
    kept = 0
    for i in range(sq):
        p = i + sk - sq
        for j in range(sk):
            if (causal and j > p) or (left >= 0 and j < p - left) or (right >= 0 and j > p + right):
                continue
            kept += 1
    return kept


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 24), st.integers(1, 24), st.integers(-1, 30), st.integers(-1, 30), st.booleans())
def test_a_window_s_flops_count_the_pairs_it_keeps(sq: int, sk: int, left: int, right: int, causal: bool) -> None:
    right = min(right, 0) if causal else right
    problem = Problem(1, 1, sq, sk, 8, causal=causal, window_left=left, window_right=right)
    if problem.local:
        assert problem.flops == 4 * 8 * brute_pairs(sq, sk, left, right, causal)
    # causal is a right bound of 0
    assert window_pairs(sq, sk, left, 0 if causal else right) == brute_pairs(sq, sk, left, right, causal)


@given(st.integers(-1, 10**6), st.integers(-1, 10**6))
def test_window_text_reads_back(left: int, right: int) -> None:
    assert parse_window(window_text(left, right, causal=False)) == (left, right)


@pytest.mark.parametrize("bad", [dict(window_left=-2), dict(window_right=True), dict(softcap=-1.0),
                                 dict(softcap=float("nan")), dict(causal=True, window_right=5)])
def test_bad_windows_and_softcaps_are_one_line_errors(bad: dict) -> None:
    with pytest.raises(TunerError) as err:
        Problem(1, 1, 8, 8, 64, **bad)
    assert "\n" not in str(err.value)


def test_causal_spells_its_right_bound_one_way() -> None:
    assert Problem(1, 1, 8, 8, 64, causal=True, window_left=4, window_right=0) == \
        Problem(1, 1, 8, 8, 64, causal=True, window_left=4) == Problem(1, 1, 8, 8, 64, window_left=4, window_right=0)
    assert Problem(1, 1, 8, 8, 64, window_right=0) == Problem(1, 1, 8, 8, 64, causal=True)
    assert Problem(1, 32, 16384, 16384, 128, causal=True, heads_kv=8, window_left=4096, softcap=50).label == \
        "B1 H32 Hkv8 S16384 D128 fp16 causal window 4096 softcap 50"


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(TEMPLATES), st.integers(-1, 70000),
       st.integers(-1, 70000), st.booleans(),
       st.one_of(st.just(0.0), st.floats(min_value=1e-3, max_value=1e4, allow_nan=False, allow_infinity=False)))
def test_masked_variant_names_read_back(template: str, left: int, right: int, causal: bool, softcap: float) -> None:
    right = -1 if causal else right
    problem = Problem(1, 8, 1, 256, 128, dtype="bf16", causal=causal, window_left=left, window_right=right,
                      softcap=softcap)
    variant = covering_sample(template, problem, load_profile("h100"), seed=0)[0]
    assert (variant.causal, variant.window_left, variant.window_right, variant.softcap) == \
        (causal or right == 0, left, -1 if right == 0 else right, softcap)  # a right bound of 0 is causality
    assert parse_variant_name(variant.name) == variant
    assert type(variant).from_stored(template, variant.stored_params()) == variant


def test_templates_without_windows_say_so_and_variants_must_match_the_problem() -> None:
    problem = Problem(1, 8, 512, 512, 64, causal=True, window_left=128)
    capped = Problem(1, 8, 16, 64, 64, softcap=30)
    for name in TEMPLATES:  # every template has both (the sm_80 forward since issue 39) ...
        for short in (dataclasses.replace(problem, seq_q=16), capped):  # Sq 16: the decode templates' too
            assert not supports_problem(load_manifest(name), short), name
    mma = load_manifest("attn_fwd_mma")  # ... so a manifest without them stands in for one that lacks them
    bare = dataclasses.replace(mma, features=dataclasses.replace(mma.features, windows=False, softcap=False))
    assert "no sliding windows" in supports_problem(bare, problem)
    assert "no logit softcapping" in supports_problem(bare, capped)
    h100 = load_profile("h100")
    plain = covering_sample("attn_fwd_wgmma", Problem(1, 8, 512, 512, 64, causal=True), h100, seed=0)[0]
    assert not check(plain, problem, h100) and "window or softcap" in check(plain, problem, h100).reason
    windowed = variant_from_params("attn_fwd_wgmma", problem, plain.params)
    assert check(windowed, problem, h100)


def test_a_plain_variant_renders_no_mask_and_a_masked_one_its_constants() -> None:
    h100 = load_profile("h100")
    plain = covering_sample("attn_fwd_wgmma", Problem(1, 8, 512, 512, 64), h100, seed=0)[0]
    assert mask_type(plain) == "fc::NoMask" and "fc::NoMask, false, false>" in render(plain)
    masked = variant_from_params("attn_fwd_wgmma", Problem(1, 8, 512, 512, 64, window_left=4096, softcap=50.0),
                                 plain.params)
    assert mask_type(masked) == "fc::Mask<4096, -1, 0x42480000u>"  # 50.0f


def test_a_windowed_softcapped_problem_round_trips_through_the_store() -> None:
    from tuner.store.models import ProblemTable
    from tuner.store.queries import PROBLEM_KEYS, to_problem

    problem = Problem(2, 16, 1024, 1024, 128, dtype="bf16", causal=True, heads_kv=4, window_left=511, softcap=30.5)
    assert {"window_left", "window_right", "softcap"} <= set(PROBLEM_KEYS)
    assert to_problem(ProblemTable(**problem.to_dict())) == problem


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("template, problem", [
    ("attn_fwd_wgmma", Problem(1, 8, 512, 512, 128, dtype="bf16", causal=True, window_left=4096, softcap=50.0)),
    ("attn_fwd_wgmma", Problem(1, 8, 512, 700, 256, window_left=100, window_right=30)),
    ("attn_decode", Problem(2, 32, 1, 8192, 128, dtype="bf16", causal=True, heads_kv=8, window_left=4095)),
    ("attn_decode_sm80", Problem(2, 8, 4, 3000, 64, causal=True, heads_kv=2, window_left=1000, softcap=30.0)),
])
def test_masked_variants_compile(template: str, problem: Problem, tmp_path: Path, monkeypatch) -> None:
    from tuner.runtime.build import build_many

    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    profile = load_profile("h100")
    variants = covering_sample(template, problem, profile, seed=1)[:2]
    for variant, built in zip(variants, build_many(variants, profile.nvcc_arch)):
        assert built.ok, f"{variant.name}: {built.compiled.log[-1500:]}"
        assert built.compiled.spill_bytes == 0 or template == "attn_fwd_wgmma"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("problem", [
    Problem(1, 8, 700, 700, 64, causal=True, window_left=100),                          # causal, a window
    Problem(1, 8, 300, 700, 128, dtype="bf16", window_left=50, window_right=30),         # both sides, Sq < Sk
    Problem(2, 8, 512, 512, 128, dtype="bf16", causal=True, heads_kv=2, softcap=30.0),  # a softcap
], ids=lambda p: p.label.replace(" ", "_"))
def test_the_sm80_forward_takes_windows_and_softcap(problem: Problem, tmp_path: Path, monkeypatch) -> None:
    """attn_fwd_mma compiles the window and softcap in (common/mask.h, issue 39): feasible on an A100, its
    covering sample (every value of every parameter: Q in registers or not, key splits, 1-3 stages) renders the
    mask and builds for sm_80."""
    from tuner.runtime.build import build_many

    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    a100 = load_profile("a100")
    variants = covering_sample("attn_fwd_mma", problem, a100, seed=1)
    assert variants and all(check(v, problem, a100) for v in variants)
    assert all(mask_type(v).startswith("fc::Mask<") and f", {mask_type(v)}>;\n" in render(v) for v in variants)
    for variant, built in zip(variants, build_many(variants, a100.nvcc_arch)):
        assert built.ok, f"{variant.name}: {built.compiled.log[-1500:]}"
