"""e4m3 in names: variant names, their tunables part, stored params and study names read back, and a
template's source renders for it (the Hopper template, which has an FP8 path)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.kernels.manifest import load_manifest
from tuner.kernels.render import render
from tuner.kernels.variant import Variant, full_name, parse_variant_name, short_name
from tuner.problem import DTYPES, Problem
from tuner.search.samplers import study_name

PROBE = "attn_fwd_wgmma"  # the Hopper template: it declares e4m3
PROBES = (PROBE, "attn_decode")  # and the decode template: the FP8 KV cache's dtypes


def test_every_dtype_has_a_template() -> None:
    assert set(DTYPES) == {d for p in PROBES for d in load_manifest(p).features.dtypes}


@st.composite
def variants(draw: st.DrawFn) -> Variant:
    manifest = load_manifest(draw(st.sampled_from(PROBES)))
    params = {name: draw(st.sampled_from(spec.values)) for name, spec in manifest.params.items()}
    causal = draw(st.booleans())
    return Variant(manifest.name, draw(st.sampled_from(manifest.features.head_dims)),
                   draw(st.sampled_from(manifest.features.dtypes)), causal, params, draw(st.integers(-1, 70000)),
                   -1 if causal else draw(st.just(-1) | st.integers(1, 70000)), draw(st.sampled_from([0.0, 30.0, 50.5])))


@settings(max_examples=150, deadline=None)
@given(variants())
def test_every_dtype_s_variant_names_read_back(variant: Variant) -> None:
    """bf16_kv_e4m3 begins like bf16: names still read back whole (the dtypes match longest first)."""
    name = variant.name
    assert f"_d{variant.head_dim}_{variant.dtype}_" in name
    assert parse_variant_name(name) == variant
    assert full_name(short_name(name), variant.template, variant.head_dim, variant.dtype) == name
    assert not short_name(name).startswith(variant.dtype) and not short_name(name).startswith("kv_")
    assert Variant.from_stored(variant.template, variant.stored_params()) == variant


def test_an_fp8_study_has_a_name_of_its_own() -> None:
    fp8 = Problem(1, 32, 4096, 4096, 128, dtype="e4m3", causal=True, heads_kv=8)
    name = study_name("h100", "attn_fwd_wgmma", fp8)
    assert name == "h100-attn_fwd_wgmma-B1H32Hkv8S4096S4096D128-e4m3-causal"
    assert name != study_name("h100", "attn_fwd_wgmma", Problem(1, 32, 4096, 4096, 128, dtype="bf16", causal=True,
                                                                heads_kv=8))


def test_an_fp8_variant_renders_with_the_fp8_element_type() -> None:
    variant = parse_variant_name(f"{PROBE}_d128_e4m3_m128n128_s2_sw128_r24_ov")
    assert "__nv_fp8_e4m3, 128, " in render(variant)


def test_the_cli_lists_an_fp8_space_and_renders_its_tunables_part() -> None:
    from cli_helpers import run_tuner

    listed = run_tuner("space", "--gpu", "h100", "--shape", "1,8,512,128", "--dtype", "e4m3", "--template", PROBE,
                       "--format", "json")
    assert listed.exit_code == 0, listed.stderr
    names = [v["name"] for v in json.loads(listed.stdout)]
    assert names and all(n.startswith(f"{PROBE}_d128_e4m3_") for n in names)
    rendered = run_tuner("render", short_name(names[0]), "--template", PROBE, "--head-dim", "128", "--dtype", "e4m3")
    assert rendered.exit_code == 0, rendered.stderr
    assert f"{names[0]}(ATTN_FWD_PARAMS)" in rendered.stdout


def test_a_synthetic_recording_times_fp8_variants_at_the_fp8_peak_and_their_baselines_at_bf16_s(tmp_path) -> None:
    from tuner.backends.synthetic import write_synthetic_recording
    from tuner.status import TrialStatus
    from tuner.store import TrialFilter, open_store

    fp8, bf16 = (Problem(4, 16, 2048, 2048, 128, dtype=d) for d in ("e4m3", "bf16"))
    url = f"sqlite:///{tmp_path / 'synthetic.db'}"
    assert write_synthetic_recording(url, [fp8, bf16], template=PROBE) > 0
    with open_store(url, create=False) as store:
        best = {r.problem.dtype: r for r in store.best_trials(TrialFilter())}
        baselines = {d: {b.impl: b.median_us for b in store.baselines_for(best[d].run_id, best[d].problem_id)}
                     for d in ("e4m3", "bf16")}
        assert {r.status for r in store.query_trials(TrialFilter(dtype="e4m3"))} >= {TrialStatus.OK}
    assert best["e4m3"].variant_name.startswith(f"{PROBE}_d128_e4m3_")
    assert best["e4m3"].median_us < 0.6 * best["bf16"].median_us  # twice the peak, less the launch overhead
    assert baselines["e4m3"] == baselines["bf16"] and baselines["e4m3"]
