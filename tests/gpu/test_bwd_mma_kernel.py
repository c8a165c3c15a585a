"""The sm_80 mma.sync backward template (attn_bwd_mma) on a real GPU: dQ, dK and dV from our forward's output and
lse (attn_fwd_mma) against fp32 autograd of the reference, every element written, over head dims, dtypes, causal
and not, GQA, Sq != Sk, odd lengths, windows, softcap and several tilings each."""

from __future__ import annotations

import pytest

from tests.gpu.reference_checks import DENSE_BACKWARD_PROBLEMS, sample_variants
from tuner.kernels.variant import parse_variant_name
from tuner.problem import Problem
from tuner.runtime.backward_verify import check_backward

pytestmark = pytest.mark.gpu
TEMPLATE = "attn_bwd_mma"

PROBLEMS = DENSE_BACKWARD_PROBLEMS + [
    Problem(1, 2, 129, 129, 32, dtype="bf16", causal=True),     # head dim 32
    # Sliding windows and softcap: query tiles outside a key block's reach skipped, partial tiles masked both sides.
    Problem(1, 2, 600, 600, 64, dtype="bf16", causal=True, window_left=20),
    Problem(1, 2, 250, 650, 128, window_left=70, window_right=10),
    Problem(1, 2, 450, 280, 64, causal=True, window_left=100),  # Sq > Sk: rows that see no key
    Problem(1, 4, 333, 333, 64, dtype="bf16", softcap=5.0, heads_kv=2),
    Problem(1, 2, 190, 190, 128, causal=True, softcap=50.0),
]


def _id(p: Problem) -> str:
    return p.label.replace(" ", "_") + "_" + p.layout


@pytest.mark.parametrize("problem", PROBLEMS, ids=_id)
def test_gradients_match_fp32_autograd(problem: Problem, gpu_profile) -> None:
    checks = check_backward(problem, sample_variants(TEMPLATE, problem, gpu_profile, extra=2), gpu_profile)
    failed = [c.line(problem.label) for c in checks if not c.ok]
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize("name", ["attn_bwd_mma_d128_bf16_m64n128_w8_xor_s2", "attn_bwd_mma_d64_fp16_m64n128_w8_xor_s2",
                                  "attn_bwd_mma_d128_fp16_m32n64_w4_pad_s1_causal"])
def test_named_tilings_at_training_shapes(name: str, gpu_profile) -> None:
    """The tilings a training shape would use, on a longer sequence (many query tiles per CTA, both ring slots)."""
    v = parse_variant_name(name)
    problem = Problem(2, 4, 2048, 2048, v.head_dim, dtype=v.dtype, causal=v.causal, heads_kv=2)
    checks = check_backward(problem, [v], gpu_profile)
    assert all(c.ok for c in checks), "\n".join(c.line(problem.label) for c in checks)
