"""The sm_80 mma.sync template on a real GPU: every output element right, every variant kind."""

from __future__ import annotations

import pytest

from tests.gpu.reference_checks import assert_variants_match_reference, run_sanitizer, sample_variants
from tuner.problem import Problem

pytestmark = pytest.mark.gpu
TEMPLATE = "attn_fwd_mma"

PROBLEMS = [
    Problem(2, 4, 128, 128, 64),
    Problem(1, 2, 1, 1, 64),                                   # S = 1
    Problem(1, 2, 17, 17, 64),                                 # tails smaller than any tile
    Problem(1, 2, 1000, 1000, 128, dtype="bf16"),              # tails, bf16, D 128
    Problem(1, 2, 100, 300, 64, causal=True),                  # causal, Sq < Sk (bottom-right)
    Problem(1, 2, 300, 100, 64, causal=True),                  # causal, Sq > Sk: rows that see no key
    Problem(2, 8, 257, 257, 64, heads_kv=2),                   # GQA
    Problem(2, 4, 200, 190, 128, layout="bshd"),               # BSHD strides
    Problem(1, 4, 513, 513, 128, dtype="bf16", causal=True),   # bf16 causal D 128
    Problem(1, 2, 129, 129, 32),                               # extra head dims
    Problem(1, 2, 129, 129, 96, dtype="bf16"),
    Problem(1, 2, 130, 130, 256),
    # Sliding windows and softcap (issue 39): tiles left of the window skipped, partial tiles masked on both sides.
    Problem(1, 2, 600, 600, 64, dtype="bf16", causal=True, window_left=20),    # narrower than any tile
    Problem(2, 4, 900, 900, 128, causal=True, window_left=300, heads_kv=1),    # MQA
    Problem(1, 2, 250, 650, 64, window_left=70, window_right=10, layout="bshd"),  # both sides, Sq < Sk
    Problem(1, 2, 450, 280, 128, causal=True, window_left=100),                # Sq > Sk: rows that see no key
    Problem(1, 2, 300, 300, 32, window_left=0, window_right=0),                # each query its own key only
    Problem(1, 2, 190, 190, 256, dtype="bf16", causal=True, softcap=50.0),
    Problem(1, 4, 333, 333, 64, dtype="bf16", softcap=5.0, heads_kv=2),        # strong capping
    Problem(1, 4, 640, 700, 96, causal=True, window_left=150, softcap=30.0),
]


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.label.replace(" ", "_") + "_" + p.layout)
def test_variants_match_fp32_reference(problem: Problem, gpu_profile) -> None:
    assert_variants_match_reference(sample_variants(TEMPLATE, problem, gpu_profile), problem, gpu_profile)


def test_compute_sanitizer_memcheck_clean(gpu_profile) -> None:
    proc = run_sanitizer("memcheck")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "ERROR SUMMARY: 0 errors" in proc.stdout
