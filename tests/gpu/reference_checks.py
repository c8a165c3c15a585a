"""What every template's GPU correctness test does: pick variants, build them, compare with fp32."""

from __future__ import annotations

import math
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.kernels.feasibility import covering_sample, feasible_space
from tuner.problem import Problem
from tuner.runtime.build import build_many
from tuner.runtime.fp8 import dequantized_inputs
from tuner.runtime.verify import TOLERANCE, empty_output, fp8_inputs, make_inputs, problem_reference, relative_error


# The backward templates' gradient cases without a window, a softcap or an unusual head dim, which every backward
# template supports (tests/gpu/test_bwd_*_kernel.py; a template adds the masked cases it supports).
DENSE_BACKWARD_PROBLEMS = [
    Problem(2, 4, 128, 128, 64),
    Problem(1, 2, 1, 1, 64),                                    # S = 1
    Problem(1, 2, 17, 17, 128, dtype="bf16"),                   # tails smaller than any tile
    Problem(1, 2, 130, 130, 64, dtype="bf16", causal=True),
    Problem(1, 2, 1000, 1000, 128, causal=True),                # long tails, causal, D 128
    Problem(1, 2, 1000, 1000, 64, dtype="bf16"),
    Problem(1, 2, 100, 300, 64, causal=True),                   # causal, Sq < Sk (bottom-right)
    Problem(1, 2, 300, 100, 128, dtype="bf16", causal=True),    # causal, Sq > Sk: rows that see no key
    Problem(1, 2, 17, 130, 128),                                # Sq != Sk
    Problem(2, 8, 257, 257, 64, heads_kv=2),                    # GQA
    Problem(2, 8, 130, 1000, 128, dtype="bf16", causal=True, heads_kv=2),  # GQA, causal, Sq < Sk
    Problem(1, 8, 1000, 17, 64, dtype="bf16", heads_kv=2),      # GQA, Sq > Sk
    Problem(2, 4, 200, 190, 128, layout="bshd"),                # BSHD strides
]


def sample_variants(template: str, problem: Problem, profile, extra: int = 3) -> list:
    """A covering sample (every value of every parameter) plus `extra` random feasible variants."""
    chosen = covering_sample(template, problem, profile, seed=problem.seq_q)
    pool = [v for v in feasible_space(template, problem, profile) if v not in chosen]
    return chosen + random.Random(problem.seq_k).sample(pool, min(extra, len(pool)))


def assert_variants_match_reference(variants: list, problem: Problem, profile) -> None:
    """Each variant, on fresh inputs, writes every output element and lse within tolerance of fp32."""
    import torch

    scale = 1.0 / math.sqrt(problem.head_dim)
    for variant, built in zip(variants, build_many(variants, profile.nvcc_arch)):
        assert built.ok, f"{variant.name} failed to compile:\n{built.compiled.log[-2000:]}"
        kernel = built.load()
        if problem.fp8:  # the reference on the dequantised values, the kernel given the descales
            q, k, v, descales = fp8_inputs(problem)
            ref, ref_lse = problem_reference(problem, *dequantized_inputs(q, k, v, descales), scale)
        else:
            q, k, v = make_inputs(problem)
            descales = None
            ref, ref_lse = problem_reference(problem, q, k, v, scale)
        out = empty_output(q)  # NaN-poisoned
        lse = torch.full((problem.batch, problem.heads, problem.seq_q), float("nan"), device="cuda")
        kernel(q, k, v, out, lse, scale, descales=descales)
        torch.cuda.synchronize()
        assert out.stride() == q.stride()
        err = relative_error(out, ref)
        assert err < TOLERANCE[problem.dtype], f"{variant.name} on {problem.label}: rel error {err:.2e}"
        assert not torch.isnan(lse).any(), f"{variant.name}: lse not fully written"
        finite = torch.isfinite(ref_lse)
        assert torch.equal(finite, torch.isfinite(lse)), f"{variant.name}: -inf rows differ"
        torch.testing.assert_close(lse[finite], ref_lse[finite], atol=2e-3, rtol=1e-3)


def run_sanitizer(tool: str, *case: str) -> subprocess.CompletedProcess:
    """compute-sanitizer --tool `tool` over sanitize_case.py `case` (the test skips without the sanitizer)."""
    sanitizer = shutil.which("compute-sanitizer")
    if sanitizer is None:
        pytest.skip("compute-sanitizer not on PATH")
    script = Path(__file__).with_name("sanitize_case.py")
    return subprocess.run([sanitizer, "--tool", tool, "--error-exitcode", "3", sys.executable, str(script), *case],
                          capture_output=True, text=True, timeout=600)


def assert_sanitizer_clean(tool: str, *case: str) -> None:
    """compute-sanitizer `tool` over sanitize_case.py `case` reports no error (memcheck) or hazard (racecheck)."""
    proc = run_sanitizer(tool, *case)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "ERROR SUMMARY: 0 errors" in proc.stdout or "RACECHECK SUMMARY: 0 hazards" in proc.stdout
