"""128K contexts on a real sm_90 GPU: prefill at S = 131072 (plain causal and a 4096 window) and decode over
131072 keys, where offsets pass 2^31 elements (a 32-bit index would wrap). The fp32 reference of a 131072^2
problem covers sampled query rows (tuner.runtime.verify.expected_output), as the search's verify gate does."""

from __future__ import annotations

import math

import pytest

from tuner.kernels.variant import parse_variant_name, variant_from_params
from tuner.problem import Problem
from tuner.runtime.build import build_many
from tuner.runtime.verify import TOLERANCE, empty_output, expected_output, make_inputs

pytestmark = pytest.mark.gpu


def _check(problem: Problem, names: list[str], hopper) -> None:
    import torch

    variants = [variant_from_params(parse_variant_name(n).template, problem, parse_variant_name(n).params)
                for n in names]
    q, k, v = make_inputs(problem, seed=7)
    scale = 1.0 / math.sqrt(problem.head_dim)
    expected = expected_output(problem, q, k, v, scale)
    for variant, built in zip(variants, build_many(variants, hopper.nvcc_arch)):
        assert built.ok, built.compiled.log[-2000:]
        out = empty_output(q)
        built.load()(q, k, v, out, None, scale)
        torch.cuda.synchronize()
        err = expected.error(out)
        assert err < TOLERANCE[problem.dtype], f"{variant.name} on {problem.label}: rel error {err:.2e}"
        assert not torch.isnan(out).any(), f"{variant.name}: unwritten output"
        del out


@pytest.mark.parametrize("window", [-1, 4096])
def test_prefill_at_131072_keys(hopper, window: int) -> None:
    problem = Problem(1, 32, 131072, 131072, 128, dtype="bf16", causal=True, heads_kv=8, window_left=window)
    _check(problem, ["attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_causal",
                     "attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp_p_causal"], hopper)


def test_decode_over_a_cache_of_more_than_2_31_elements(hopper) -> None:
    """K and V of B16 Hkv8 Sk131072 D128 hold 2^31 elements each: the last batch row's keys lie past
    every 32-bit offset."""
    from tuner.kernels.feasibility import covering_sample

    problem = Problem(16, 32, 1, 131072, 128, dtype="bf16", heads_kv=8)
    names = [v.name for v in covering_sample("attn_decode", problem, hopper, seed=0)[:2]]
    names += [v.name for v in covering_sample("attn_decode_sm80", problem, hopper, seed=0)[:1]]
    _check(problem, names, hopper)
