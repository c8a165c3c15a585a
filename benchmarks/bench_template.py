"""Screen many variants of a template on one shape, then A/B the best against SDPA.

Every variant is verified against the fp32 reference before it is timed.
Phase 1 times each candidate once (L2 flushed, median of reps); phase 2
re-times the top K and the SDPA backends in interleaved rounds
(ab_ratio.interleaved) and prints the median per-round ratio (single
timings drift by a few % between runs).

    python benchmarks/bench_template.py --template attn_fwd_wgmma --shape 16,16,2048,64 \
        --sample 40 --top 3 --rounds 5 [--causal] [--dtype bf16] [--variant NAME ...]
"""

from __future__ import annotations

import argparse
import math
import random
import time

import torch
from ab_ratio import interleaved, print_rows

from tuner.kernels.feasibility import feasible_space
from tuner.kernels.variant import parse_variant_name
from tuner.problem import problem_from_shape
from tuner.profiles import resolve_profile
from tuner.runtime.build import build_many
from tuner.runtime.driver import cuda_driver
from tuner.runtime.timing import time_cuda
from tuner.runtime.verify import TOLERANCE, empty_output, make_inputs, reference, relative_error

ap = argparse.ArgumentParser()
ap.add_argument("--template", default="attn_fwd_wgmma")
ap.add_argument("--shape", required=True)
ap.add_argument("--dtype", default="fp16")
ap.add_argument("--causal", action="store_true")
ap.add_argument("--sample", type=int, default=30, help="random feasible variants besides --variant")
ap.add_argument("--variant", action="append", default=[], help="variant name (repeatable)")
ap.add_argument("--top", type=int, default=3)
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--seed", type=int, default=0)
args = ap.parse_args()

cuda_driver(0)
profile = resolve_profile("auto")
problem = problem_from_shape(args.shape, dtype=args.dtype, causal=args.causal)
pool = feasible_space(args.template, problem, profile)
chosen = [parse_variant_name(n) for n in args.variant]
rest = [v for v in pool if v not in chosen]
chosen += random.Random(args.seed).sample(rest, min(args.sample, len(rest)))
t0 = time.time()
compiled = build_many(chosen, profile.nvcc_arch)
print(f"{torch.cuda.get_device_name(0)} {problem.label}: {len(pool)} feasible, {len(chosen)} compiled "
      f"in {time.time() - t0:.0f} s", flush=True)

q, k, v = make_inputs(problem, seed=0)
scale = 1.0 / math.sqrt(problem.head_dim)
ref, _ = reference(q, k, v, problem.causal, scale)
screened = []
for var, res in zip(chosen, compiled):
    if not res.ok:
        print(f"  COMPILE ERROR {var.name}: {res.compiled.log.strip().splitlines()[-1:]}")
        continue
    kern = res.load()
    out = empty_output(q)
    kern(q, k, v, out, None, scale)
    torch.cuda.synchronize()
    err = relative_error(out, ref)
    if not err < TOLERANCE[problem.dtype]:
        print(f"  INCORRECT {var.name} rel err {err:.2e}")
        continue
    call = (lambda kern=kern, out=out: kern.launch_unchecked(q, k, v, out, None, scale))
    us = time_cuda(call, l2_bytes=profile.l2_bytes, rep_ms=30).median_us
    screened.append((us, var.name, call, res.compiled.registers, res.compiled.spill_bytes))
screened.sort(key=lambda row: row[0])
for us, name, _, regs, spill in screened[: max(10, args.top)]:
    print(f"  {name:64s} {us:8.1f} us {problem.tflops(us):6.1f} TFLOP/s regs {regs} spill {spill}")

print(f"interleaved, {args.rounds} rounds:")
print_rows(interleaved(problem, [name for _, name, _, _, _ in screened[: args.top]], args.rounds))
