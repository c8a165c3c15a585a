"""One variant and FlashAttention-4 on one problem, each a few times inside its own NVTX range, for ncu to
profile side by side (the limiter of each: pipe utilisation, warp stalls, issue slots).

    ncu --clock-control none --nvtx --nvtx-include "ours/" --nvtx-include "fa4/" \\
        --section SpeedOfLight --section WarpStateStats ... \\
        python benchmarks/limiter_run.py VARIANT --shape 8,16,2048,128 [--hkv 8] [--cubin .ab/old/VARIANT.cubin]
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import nvtx
import torch

from tuner.kernels.variant import parse_variant_name
from tuner.problem import problem_from_shape
from tuner.profiles import resolve_profile
from tuner.runtime.baselines import fa4_baseline
from tuner.runtime.build import build, launch_shape
from tuner.runtime.shipped.launcher import AttentionKernel
from tuner.runtime.driver import cuda_driver
from tuner.runtime.verify import empty_output, make_inputs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("variant")
    ap.add_argument("--shape", required=True)
    ap.add_argument("--hkv", type=int, default=None)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--cubin", type=Path, default=None,
                    help="profile this cubin of the variant (build_cubins.py, another template revision)")
    args = ap.parse_args()
    cuda_driver(0)
    variant = parse_variant_name(args.variant)
    problem = problem_from_shape(args.shape, dtype=variant.dtype, causal=variant.causal, heads_kv=args.hkv)
    if args.cubin is not None:
        kernel = AttentionKernel(args.cubin.read_bytes(), variant.name, launch_shape(variant), 0)
    else:
        built = build(variant, resolve_profile("auto").nvcc_arch)
        assert built.ok, built.compiled.log
        kernel = built.load()
    q, k, v = make_inputs(problem)
    out = empty_output(q)
    scale = 1.0 / math.sqrt(problem.head_dim)
    fa4 = fa4_baseline(q, k, v, problem.causal, scale, (problem.window_left, problem.window_right), problem.softcap)
    for _ in range(3):  # warm up outside the ranges (FA4 compiles on its first call)
        kernel(q, k, v, out, None, scale)
        if fa4 is not None:
            fa4.call()
    torch.cuda.synchronize()
    for _ in range(args.runs):
        with nvtx.annotate("ours"):
            kernel(q, k, v, out, None, scale)
        if fa4 is not None:
            with nvtx.annotate("fa4"):
                fa4.call()
    torch.cuda.synchronize()
    print("ran", variant.name, "and", "FA4" if fa4 is not None else "no FA4", "on", problem.label)


if __name__ == "__main__":
    main()
