"""Variants: validation against the manifest, procedural names, store identity."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.cli.tables import short_variant
from tuner.errors import TunerError
from tuner.kernels.manifest import list_templates, load_manifest
from tuner.kernels.render import render
from tuner.kernels.variant import (
    Variant,
    enumerate_space,
    full_name,
    parse_variant_name,
    short_name,
    templates_of_short_name,
    validate_variant,
)
from tuner.problem import Problem

TEMPLATE = "attn_fwd_mma"
MANIFEST = load_manifest(TEMPLATE)


@st.composite
def variants(draw: st.DrawFn) -> Variant:
    params = {name: draw(st.sampled_from(spec.values)) for name, spec in MANIFEST.params.items()}
    return Variant(
        TEMPLATE,
        draw(st.sampled_from(MANIFEST.features.head_dims)),
        draw(st.sampled_from(MANIFEST.features.dtypes)),
        draw(st.booleans()),
        params,
    )


@settings(max_examples=200, deadline=None)
@given(variants())
def test_name_round_trips(variant: Variant) -> None:
    assert parse_variant_name(variant.name) == variant


@st.composite
def any_template_variants(draw: st.DrawFn, template: str | None = None) -> Variant:
    """A variant of any shipped template (or of `template`)."""
    manifest = load_manifest(template or draw(st.sampled_from(sorted(m.name for m in list_templates()))))
    params = {name: draw(st.sampled_from(spec.values)) for name, spec in manifest.params.items()}
    return Variant(manifest.name, draw(st.sampled_from(manifest.features.head_dims)),
                   draw(st.sampled_from(manifest.features.dtypes)), draw(st.booleans()) and manifest.features.causal,
                   params)


@settings(max_examples=300, deadline=None)
@given(any_template_variants())
def test_every_templates_names_round_trip(variant: Variant) -> None:
    assert parse_variant_name(variant.name) == variant


@settings(max_examples=300, deadline=None)
@given(any_template_variants())
def test_the_short_name_the_cli_prints_round_trips(variant: Variant) -> None:
    short = short_name(variant.name)
    assert short_variant(variant.name) == short  # what `tuner results` and the search summary print
    assert not short.startswith(variant.template) and variant.template in templates_of_short_name(short)
    assert parse_variant_name(full_name(short, variant.template, variant.head_dim, variant.dtype)) == variant


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_short_name_tells_the_tunables_of_a_template_apart(data: st.DataObject) -> None:
    template = data.draw(st.sampled_from(sorted(m.name for m in list_templates())))
    a, b = data.draw(any_template_variants(template)), data.draw(any_template_variants(template))
    assert (short_name(a.name) == short_name(b.name)) == (a.params == b.params and a.causal == b.causal)


@settings(max_examples=100, deadline=None)
@given(variants())
def test_stored_params_round_trip(variant: Variant) -> None:
    assert Variant.from_stored(TEMPLATE, variant.stored_params()) == variant


@settings(max_examples=100, deadline=None)
@given(variants(), variants())
def test_distinct_variants_have_distinct_names(a: Variant, b: Variant) -> None:
    assert (a.name == b.name) == (a == b)


def test_example_name_from_the_issue() -> None:
    v = parse_variant_name("attn_fwd_mma_d64_fp16_m128n64_w4_q_rows_xor_s2_qreg")
    assert (v.head_dim, v.dtype, v.causal) == (64, "fp16", False)
    assert v.params == {"BLOCK_M": 128, "BLOCK_N": 64, "NUM_WARPS": 4, "KV_SPLIT": 1, "SWIZZLE": "xor",
                        "STAGES": 2, "Q_IN_REGS": True, "MIN_BLOCKS": 1, "LAZY_RESCALE": False}
    assert parse_variant_name(v.name + "_causal").causal


@pytest.mark.parametrize(
    "params_override",
    [
        {"BLOCK_M": 48},                      # not a declared value
        {"BLOCK_M": "64"},                    # right value, wrong type
        {"Q_IN_REGS": 1},                     # int where a bool is declared (1 == True in Python)
        {"KV_SPLIT": True},                   # bool where an int is declared
        {"SWIZZLE": "xor; asm(\"trap;\")"},   # anything pasted into the source is refused
    ],
)
def test_values_outside_the_manifest_are_refused(params_override: dict) -> None:
    base = parse_variant_name("attn_fwd_mma_d64_fp16_m128n64_w4_q_rows_xor_s2_qreg")
    bad = Variant(TEMPLATE, 64, "fp16", False, {**base.params, **params_override})
    with pytest.raises(TunerError):
        validate_variant(bad)
    with pytest.raises(TunerError):
        render(bad)


def test_missing_or_unknown_parameter_is_refused() -> None:
    base = parse_variant_name("attn_fwd_mma_d64_fp16_m128n64_w4_q_rows_xor_s2_qreg")
    params = dict(base.params)
    del params["STAGES"]
    with pytest.raises(TunerError, match="missing"):
        validate_variant(Variant(TEMPLATE, 64, "fp16", False, params))
    with pytest.raises(TunerError, match="unknown"):
        validate_variant(Variant(TEMPLATE, 64, "fp16", False, {**base.params, "EXTRA": 1}))


@pytest.mark.parametrize("name", ["", "attn_fwd_mma", "attn_fwd_mma_d64_fp16_m128n64_w4_q_rows_xor_s9_qreg",
                                  "attn_fwd_mma_d80_fp16_m128n64_w4_q_rows_xor_s2_qreg", "other_d64_fp16"])
def test_malformed_names_are_refused(name: str) -> None:
    with pytest.raises(TunerError):
        parse_variant_name(name)


def test_render_names_the_entry_point_after_the_variant() -> None:
    v = parse_variant_name("attn_fwd_mma_d128_bf16_m64n32_w4_kv2_pad_s3_qsmem_causal")
    src = render(v)
    assert f'extern "C" __global__ void __launch_bounds__(TunerCfg::THREADS, TunerCfg::MIN_BLOCKS)\n{v.name}(' in src
    assert ("fc::AttnConfig<__nv_bfloat16, 128, 64, 32, 4, 2, fc::Swizzle::Pad, 3, false, 1, false, true, "
            "fc::NoMask>") in src


def test_enumeration_is_the_cartesian_product() -> None:
    space = list(enumerate_space(TEMPLATE, Problem(1, 1, 64, 64, 64)))
    expected = 1
    for spec in MANIFEST.params.values():
        expected *= len(spec.values)
    assert len(space) == expected == len(set(space))
