"""Interleaved A/B timing: variants and SDPA backends timed in alternation, several rounds.

A single timing of a ~1 ms kernel moved by ±3-5% between runs on the H200;
alternating rounds in one process and taking the median per-round ratio
gives a ratio that is robust to that drift.

    python benchmarks/ab_ratio.py --shape 8,16,2048,128 --rounds 7 VARIANT [VARIANT ...]
"""

from __future__ import annotations

import argparse
import math
import statistics

import torch

from tuner import runtime
from tuner.baselines import available_baselines
from tuner.bench import time_cuda
from tuner.compiler import compile_source

from tuner.problem import problem_from_shape
from tuner.profiles import resolve_profile
from tuner.feasibility import launch_shape
from tuner.runtime import AttentionKernel
from tuner.space import parse_variant_name
from tuner.templates import render
from tuner.verify import TOLERANCE, empty_output, make_inputs, reference, relative_error

ap = argparse.ArgumentParser()
ap.add_argument("variants", nargs="+")
ap.add_argument("--shape", required=True)
ap.add_argument("--rounds", type=int, default=7)
args = ap.parse_args()

runtime.cuda_driver(0)
profile = resolve_profile("auto")
first = parse_variant_name(args.variants[0])
problem = problem_from_shape(args.shape, dtype=first.dtype, causal=first.causal)
q, k, v = make_inputs(problem, seed=0)
scale = 1.0 / math.sqrt(problem.head_dim)
ref, _ = reference(q, k, v, problem.causal, scale)
calls = {}
for name in args.variants:
    var = parse_variant_name(name)
    res = compile_source(render(var), name, profile.nvcc_arch)
    kern = AttentionKernel(res.cubin, name, launch_shape(var))
    out = empty_output(q)
    kern(q, k, v, out, None, scale)
    torch.cuda.synchronize()
    err = relative_error(out, ref)
    assert err < TOLERANCE[problem.dtype], (name, err)
    calls[name] = (lambda kern=kern, out=out: kern.launch_unchecked(q, k, v, out, None, scale))
baselines = {b.name: b for b in available_baselines(problem, q, k, v, scale) if b.name != "sdpa_efficient"}
times: dict[str, list[float]] = {n: [] for n in [*baselines, *calls]}
for _ in range(args.rounds):
    for name, b in baselines.items():
        times[name].append(b.time(l2_bytes=profile.l2_bytes, rep_ms=60).median_us)
    for name, call in calls.items():
        times[name].append(time_cuda(call, l2_bytes=profile.l2_bytes, rep_ms=60).median_us)
print(f"{torch.cuda.get_device_name(0)} {problem.label}, {args.rounds} interleaved rounds")
for name, ts in times.items():
    med = statistics.median(ts)
    line = f"  {name:62s} median {med:8.1f} us ({problem.tflops(med):6.1f} TFLOP/s), rounds {min(ts):.1f}-{max(ts):.1f}"
    if name in calls:
        for b in baselines:
            ratios = [bt / t for bt, t in zip(times[b], ts)]
            line += f"  x{statistics.median(ratios):.3f} {b} ({min(ratios):.3f}-{max(ratios):.3f})"
    print(line, flush=True)
