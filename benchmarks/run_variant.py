"""Run one variant on one problem a few times inside an NVTX range (for ncu / compute-sanitizer).

    ncu --clock-control none --nvtx --nvtx-include "variant/" --set full \
        python benchmarks/run_variant.py attn_fwd_mma_d64_fp16_m128n64_w4_q_rows_pad_s1_qsmem --shape 16,16,2048,64
"""

from __future__ import annotations

import argparse

import nvtx
import torch

from tuner.runtime import driver as runtime
from tuner.kernels.compiler import compile_source

from tuner.problem import problem_from_shape
from tuner.profiles import resolve_profile
from tuner.kernels.feasibility import launch_shape
from tuner.runtime.driver import AttentionKernel
from tuner.kernels.variant import parse_variant_name
from tuner.kernels.manifest import render
from tuner.runtime.verify import empty_output, make_inputs

ap = argparse.ArgumentParser()
ap.add_argument("variant")
ap.add_argument("--shape", required=True)
ap.add_argument("--runs", type=int, default=3)
args = ap.parse_args()

runtime.cuda_driver(0)
profile = resolve_profile("auto")
variant = parse_variant_name(args.variant)
problem = problem_from_shape(args.shape, dtype=variant.dtype, causal=variant.causal)
res = compile_source(render(variant), variant.name, profile.nvcc_arch)
assert res.ok, res.log
kernel = AttentionKernel(res.cubin, variant.name, launch_shape(variant))
q, k, v = make_inputs(problem)
out = empty_output(q)
for _ in range(args.runs):
    with nvtx.annotate("variant"):
        kernel(q, k, v, out)
torch.cuda.synchronize()
print("ran", variant.name, "on", problem.label)
