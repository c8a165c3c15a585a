"""Run one variant on one problem a few times inside an NVTX range (for ncu / compute-sanitizer).

    ncu --clock-control none --nvtx --nvtx-include "variant/" --set full \
        python benchmarks/run_variant.py attn_fwd_mma_d64_fp16_m128n64_w4_q_rows_pad_s1_qsmem --shape 16,16,2048,64
"""

from __future__ import annotations

import argparse

import nvtx
import torch

from tuner.kernels.variant import parse_variant_name
from tuner.problem import problem_from_shape
from tuner.profiles import resolve_profile
from tuner.runtime.build import build
from tuner.runtime.driver import cuda_driver
from tuner.runtime.verify import empty_output, make_inputs

ap = argparse.ArgumentParser()
ap.add_argument("variant")
ap.add_argument("--shape", required=True)
ap.add_argument("--runs", type=int, default=3)
args = ap.parse_args()

cuda_driver(0)
profile = resolve_profile("auto")
variant = parse_variant_name(args.variant)
problem = problem_from_shape(args.shape, dtype=variant.dtype, causal=variant.causal)
built = build(variant, profile.nvcc_arch)
assert built.ok, built.compiled.log
kernel = built.load()
q, k, v = make_inputs(problem)
out = empty_output(q)
for _ in range(args.runs):
    with nvtx.annotate("variant"):
        kernel(q, k, v, out)
torch.cuda.synchronize()
print("ran", variant.name, "on", problem.label)
