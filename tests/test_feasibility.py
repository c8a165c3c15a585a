"""Feasibility: a pure rule with a reason; property tests over the whole space."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.errors import TunerError
from tuner.kernels.expr import evaluate
from tuner.kernels.feasibility import check, covering_sample, expression_names, resources, space_report, supports_problem
from tuner.kernels.manifest import list_templates, load_manifest
from tuner.kernels.variant import Variant
from tuner.problem import Problem
from tuner.profiles import list_profiles, load_profile

TEMPLATE = "attn_fwd_mma"
MANIFEST = load_manifest(TEMPLATE)
PROFILES = list_profiles()


@st.composite
def cases(draw: st.DrawFn) -> tuple[Variant, Problem, object]:
    head_dim = draw(st.sampled_from(MANIFEST.features.head_dims))
    dtype = draw(st.sampled_from(["fp16", "bf16"]))
    causal = draw(st.booleans())
    params = {name: draw(st.sampled_from(spec.values)) for name, spec in MANIFEST.params.items()}
    heads_kv = draw(st.sampled_from([1, 2, 4]))
    problem = Problem(draw(st.integers(1, 8)), 4, draw(st.integers(1, 5000)), draw(st.integers(1, 5000)),
                      head_dim, dtype=dtype, causal=causal, heads_kv=heads_kv)
    return Variant(TEMPLATE, head_dim, dtype, causal, params), problem, draw(st.sampled_from(PROFILES))


@settings(max_examples=300, deadline=None)
@given(cases())
def test_feasible_means_every_rule_and_limit_holds(case) -> None:
    variant, problem, profile = case
    result = check(variant, problem, profile)
    names = {**variant.params, "head_dim": variant.head_dim, "elem_bytes": 2, "causal": variant.causal}
    if result.ok:
        assert result.reason == ""
        assert result.smem_bytes <= profile.smem_per_block_optin
        assert result.threads <= profile.max_threads_per_block
        # a rule may name a resource (accumulator_regs): its formula is stated once, in [resources]
        assert all(evaluate(c.rule, {**names, **resources(variant)}) for c in MANIFEST.constraints)
        warps_m = variant.params["NUM_WARPS"] // variant.params["KV_SPLIT"]
        assert variant.params["BLOCK_M"] % (16 * warps_m) == 0
    else:
        assert result.reason, "an infeasible variant must say why"


@settings(max_examples=100, deadline=None)
@given(cases())
def test_check_is_deterministic_and_pure(case) -> None:
    variant, problem, profile = case
    assert check(variant, problem, profile) == check(variant, problem, profile)


def test_shared_memory_limit_is_the_profiles() -> None:
    problem = Problem(1, 1, 128, 128, 256)
    v = Variant(TEMPLATE, 256, "fp16", False, {"BLOCK_M": 128, "BLOCK_N": 128, "NUM_WARPS": 8, "KV_SPLIT": 1,
                                               "SWIZZLE": "pad", "STAGES": 3, "Q_IN_REGS": False, "MIN_BLOCKS": 1, "LAZY_RESCALE": False})
    smem = resources(v)["smem_bytes"]
    assert smem == (128 + 2 * 3 * 128) * (256 + 8) * 2
    result = check(v, problem, load_profile("h100"))
    assert not result.ok and "shared memory" in result.reason and str(smem) in result.reason
    small = dataclasses.replace(load_profile("h100"), smem_per_block_optin=smem)
    assert check(v, problem, small).reason != result.reason


def test_unsupported_problem_features_have_reasons() -> None:
    with pytest.raises(TunerError, match="head dim 80"):
        space_report(TEMPLATE, Problem(1, 1, 64, 64, 80), load_profile("h100"))
    old_card = dataclasses.replace(load_profile("a100"), compute_capability=(7, 5), name="t4")
    problem = Problem(1, 1, 64, 64, 64)
    v = next(v for v, f in space_report(TEMPLATE, problem, load_profile("a100")) if f.ok)
    assert "compute capability 8.0+" in check(v, problem, old_card).reason


@pytest.mark.parametrize("template", [m.name for m in list_templates() if "e4m3" not in m.features.dtypes])
def test_an_fp8_problem_is_refused_by_a_template_that_does_not_declare_e4m3(template: str) -> None:
    manifest = load_manifest(template)
    head_dim = manifest.features.head_dims[-1]
    problem = Problem(1, 8, 1, 512, head_dim, dtype="e4m3")
    why = f"dtype e4m3 unsupported by {template} (supported: {list(manifest.features.dtypes)})"
    assert supports_problem(manifest, problem) == why
    with pytest.raises(TunerError, match=r"^dtype e4m3 unsupported by "):
        space_report(template, problem, load_profile("h100"))
    params = {name: spec.values[0] for name, spec in manifest.params.items()}
    assert check(Variant(template, head_dim, "e4m3", False, params), problem, load_profile("h100")).reason == why


def test_the_templates_without_an_fp8_path_say_so_and_fp8_elements_are_one_byte() -> None:
    for template in ("attn_fwd_mma", "attn_decode", "attn_decode_sm80"):
        assert "e4m3" not in load_manifest(template).features.dtypes, template
    params = {name: spec.values[0] for name, spec in MANIFEST.params.items()}
    assert expression_names(Variant(TEMPLATE, 64, "e4m3", False, params))["elem_bytes"] == 1
    assert expression_names(Variant(TEMPLATE, 64, "bf16", False, params))["elem_bytes"] == 2


def test_variant_for_another_problem_is_infeasible() -> None:
    problem = Problem(1, 1, 64, 64, 64)
    v = next(v for v, f in space_report(TEMPLATE, problem, load_profile("h100")) if f.ok)
    assert not check(v, dataclasses.replace(problem, head_dim=128), load_profile("h100")).ok


@pytest.mark.parametrize("head_dim", [64, 128])
def test_covering_sample_covers_every_value(head_dim: int) -> None:
    problem = Problem(1, 1, 64, 64, head_dim)
    profile = load_profile("h100")
    sample = covering_sample(TEMPLATE, problem, profile)
    assert all(check(v, problem, profile) for v in sample)
    for name, spec in MANIFEST.params.items():
        seen = {repr(v.params[name]) for v in sample}
        assert seen == {repr(value) for value in spec.values}, name
    assert len(sample) <= 6


@pytest.mark.parametrize("text", ["__import__('os')", "open('x')", "(lambda: 1)()", "a.b", "x[0]"])
def test_manifest_expressions_are_sandboxed(text: str) -> None:
    with pytest.raises(TunerError):
        evaluate(text, {"x": [1], "a": 1})


@pytest.mark.parametrize("text", ["a // 0", "a + 'x'", "max()"])
def test_manifest_expression_runtime_errors_are_one_line(text: str) -> None:
    with pytest.raises(TunerError, match="failed") as info:
        evaluate(text, {"a": 1})
    assert "\n" not in str(info.value)


def test_manifest_expressions_compute() -> None:
    assert evaluate("max(a, 2) * 3 if b == 'x' else 0", {"a": 1, "b": "x"}) == 6
    with pytest.raises(TunerError, match="unknown_name"):
        evaluate("unknown_name + 1", {})
