"""The decode template (flash-decoding across a cluster) on a real sm_90 GPU: every output element and lse
right for short queries over short and long contexts, GQA packing, causal, BSHD, poisoned outputs."""

from __future__ import annotations

import pytest

from tests.gpu.reference_checks import assert_sanitizer_clean, assert_variants_match_reference, sample_variants
from tuner.problem import Problem

pytestmark = pytest.mark.gpu
TEMPLATE = "attn_decode"

PROBLEMS = [
    Problem(2, 32, 1, 8192, 128, dtype="bf16", heads_kv=8),                # the decode step: GQA 4
    Problem(3, 8, 1, 1, 64),                                               # one key
    Problem(2, 8, 2, 17, 64, causal=True, heads_kv=1),                     # MQA (group 8), causal, tails
    Problem(1, 16, 4, 1000, 128, dtype="bf16", causal=True, heads_kv=4),   # speculative verify: Sq 4
    Problem(2, 4, 16, 1000, 64, heads_kv=4),                               # group 1, Sq 16
    Problem(1, 32, 16, 2000, 128, dtype="bf16", causal=True, heads_kv=8),  # 64 rows per block, causal
    Problem(1, 8, 1, 65536, 128, dtype="bf16", heads_kv=2),                # a long context
    Problem(2, 8, 3, 777, 128, causal=True, heads_kv=2, layout="bshd"),    # BSHD strides
    Problem(1, 4, 20, 10, 64, causal=True),                                # Sq > Sk: rows that see no key
]


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.label.replace(" ", "_") + "_" + p.layout)
def test_variants_match_fp32_reference(problem: Problem, hopper) -> None:
    assert_variants_match_reference(sample_variants(TEMPLATE, problem, hopper), problem, hopper)


@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_compute_sanitizer_clean(tool: str, hopper) -> None:
    assert_sanitizer_clean(tool, "decode")
