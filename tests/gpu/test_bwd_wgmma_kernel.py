"""The Hopper wgmma backward template (attn_bwd_wgmma) on a real GPU (sm_90a): dQ, dK and dV from our forward's
output and lse (attn_fwd_mma) against fp32 autograd of the reference, every element written, over head dims,
dtypes, causal and not, GQA, Sq != Sk, odd lengths and BSHD strides, each with a covering sample of its tilings.
Skipped off Hopper (feasibility leaves no variant)."""

from __future__ import annotations

import dataclasses

import pytest

from tests.gpu.reference_checks import DENSE_BACKWARD_PROBLEMS, sample_variants
from tuner.kernels.variant import parse_variant_name
from tuner.problem import Problem
from tuner.runtime.backward_verify import check_backward

pytestmark = pytest.mark.gpu
TEMPLATE = "attn_bwd_wgmma"

PROBLEMS = DENSE_BACKWARD_PROBLEMS  # no window, softcap or D32 in this template yet


def _id(p: Problem) -> str:
    return p.label.replace(" ", "_") + "_" + p.layout


@pytest.mark.parametrize("problem", PROBLEMS, ids=_id)
def test_gradients_match_fp32_autograd(problem: Problem, gpu_profile) -> None:
    variants = sample_variants(TEMPLATE, problem, gpu_profile, extra=2)
    if not variants:
        pytest.skip(f"{TEMPLATE} has no feasible variant on {gpu_profile.name} (sm_90a only)")
    checks = check_backward(problem, variants, gpu_profile)
    failed = [c.line(problem.label) for c in checks if not c.ok]
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize("name", ["attn_bwd_wgmma_d128_bf16_m64n128_s2", "attn_bwd_wgmma_d64_fp16_m128n128_s2",
                                  "attn_bwd_wgmma_d128_fp16_m64n64_s1_causal", "attn_bwd_wgmma_d128_bf16_m64n128_s2_bulk",
                                  "attn_bwd_wgmma_d64_bf16_m64n64_s2_bulk_causal", "attn_bwd_wgmma_d128_bf16_m64n128_s2_p",
                                  "attn_bwd_wgmma_d128_fp16_m64n128_s2_bulk_p_causal",
                                  "attn_bwd_wgmma_d64_bf16_m128n64_s1_p", "attn_bwd_wgmma_d128_bf16_m64n128_s2_pw",
                                  "attn_bwd_wgmma_d128_bf16_m64n128_s2_bulk_pw_causal", "attn_bwd_wgmma_d64_bf16_m64n64_s3_bulk_pw",
                                  "attn_bwd_wgmma_d64_fp16_m64n64_s3_pw_causal",
                                  "attn_bwd_wgmma_d128_bf16_m80n128_s2_bulk_pw", "attn_bwd_wgmma_d128_fp16_m80n128_s2_bulk_pw",
                                  "attn_bwd_wgmma_d128_bf16_m80n128_s2_bulk_pw_causal",
                                  "attn_bwd_wgmma_d64_fp16_m64n64_s2_bulk_pw_causal"])
def test_named_tilings_at_training_shapes(name: str, gpu_profile) -> None:
    """The tilings a training shape would use, on a longer sequence (many query tiles per CTA, both ring slots)."""
    if tuple(gpu_profile.compute_capability) < (9, 0):
        pytest.skip(f"{TEMPLATE} is sm_90a only")
    v = parse_variant_name(name)
    problem = Problem(2, 4, 2048, 2048, v.head_dim, dtype=v.dtype, causal=v.causal, heads_kv=2)
    checks = check_backward(problem, [v], gpu_profile)
    assert all(c.ok for c in checks), "\n".join(c.line(problem.label) for c in checks)


# BLOCK_M 80 (dQ transposed, dq_accum in transposed 80 x 64 blocks, lse / delta rows padded to 80): lengths around
# its tile (a partial last tile, whole tiles, S = 1), Sq != Sk both ways, GQA with odd lengths, BSHD strides.
BM80_PROBLEMS = [
    Problem(1, 2, 1, 1, 128, dtype="bf16"),
    Problem(1, 2, 81, 81, 128, dtype="bf16"),
    Problem(1, 2, 160, 160, 128),
    Problem(1, 2, 79, 333, 128, dtype="bf16"),
    Problem(1, 2, 333, 79, 128),
    Problem(2, 8, 1000, 999, 128, dtype="bf16", heads_kv=2),
    Problem(2, 6, 241, 250, 128, heads_kv=3),
    Problem(2, 4, 200, 190, 128, dtype="bf16", layout="bshd"),
]


# Causal too (feasible since session 27): the diagonal's partial tiles of 80 rows beside 128-key CTAs (bottom-right
# aligned, Sq != Sk both ways), GQA and BSHD.
@pytest.mark.parametrize("problem", BM80_PROBLEMS + [dataclasses.replace(p, causal=True) for p in BM80_PROBLEMS],
                         ids=_id)
def test_block_m_80_gradients_match_fp32_autograd(problem: Problem, gpu_profile) -> None:
    if tuple(gpu_profile.compute_capability) < (9, 0):
        pytest.skip(f"{TEMPLATE} is sm_90a only")
    mask = "_causal" if problem.causal else ""
    v = parse_variant_name(f"{TEMPLATE}_d128_{problem.dtype}_m80n128_s2_bulk_pw{mask}")
    checks = check_backward(problem, [v], gpu_profile)
    assert all(c.ok for c in checks), "\n".join(c.line(problem.label) for c in checks)
