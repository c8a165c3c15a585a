"""The sm_80 mma.sync template on a real GPU: every output element right, every variant kind."""

from __future__ import annotations

import math
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.compiler import compile_many
from tuner.feasibility import covering_sample, feasible_space
from tuner.problem import Problem
from tuner.feasibility import launch_shape
from tuner.runtime import AttentionKernel
from tuner.templates import render
from tuner.verify import TOLERANCE, empty_output, make_inputs, reference, relative_error

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
]


def _variants(problem: Problem, profile) -> list:
    chosen = covering_sample(TEMPLATE, problem, profile, seed=problem.seq_q)
    pool = [v for v in feasible_space(TEMPLATE, problem, profile) if v not in chosen]
    chosen += random.Random(problem.seq_k).sample(pool, min(3, len(pool)))
    return chosen


def _load(variants, profile) -> list[AttentionKernel]:
    results = compile_many([(render(v), v.name, profile.nvcc_arch) for v in variants])
    kernels = []
    for v, res in zip(variants, results):
        assert res.ok, f"{v.name} failed to compile:\n{res.log[-2000:]}"
        kernels.append(AttentionKernel(res.cubin, v.name, launch_shape(v)))
    return kernels


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.label.replace(" ", "_") + "_" + p.layout)
def test_variants_match_fp32_reference(problem: Problem, gpu_profile) -> None:
    import torch

    variants = _variants(problem, gpu_profile)
    kernels = _load(variants, gpu_profile)
    scale = 1.0 / math.sqrt(problem.head_dim)
    for variant, kernel in zip(variants, kernels):
        q, k, v = make_inputs(problem)  # fresh inputs for every variant
        ref, ref_lse = reference(q, k, v, problem.causal, scale)
        out = empty_output(q)
        lse = torch.full((problem.batch, problem.heads, problem.seq_q), float("nan"), device="cuda")
        kernel(q, k, v, out, lse, scale)
        torch.cuda.synchronize()
        assert out.stride() == q.stride()
        err = relative_error(out, ref)
        assert err < TOLERANCE[problem.dtype], f"{variant.name} on {problem.label}: rel error {err:.2e}"
        assert not torch.isnan(lse).any(), f"{variant.name}: lse not fully written"
        finite = torch.isfinite(ref_lse)
        assert torch.equal(finite, torch.isfinite(lse)), f"{variant.name}: -inf rows differ"
        torch.testing.assert_close(lse[finite], ref_lse[finite], atol=2e-3, rtol=1e-3)


def test_compute_sanitizer_memcheck_clean(gpu_profile, tmp_path: Path) -> None:
    sanitizer = shutil.which("compute-sanitizer")
    if sanitizer is None:
        pytest.skip("compute-sanitizer not on PATH")
    script = Path(__file__).with_name("sanitize_case.py")
    proc = subprocess.run([sanitizer, "--tool", "memcheck", "--error-exitcode", "3", sys.executable, str(script)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "ERROR SUMMARY: 0 errors" in proc.stdout
