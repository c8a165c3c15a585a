"""Sweep the mma template over problems on the GPU, against SDPA backends timed in the same process.

Until `tuner search` lands this is how the template's figures are measured:
every selected variant is compiled (process pool), verified against the fp32
reference on fresh inputs (poisoned output), then timed with bench.time_cuda;
the SDPA backends are timed the same way. Writes JSON lines to --out.

    python benchmarks/bench_mma.py --shape 16,16,2048,64 --shape 8,16,2048,128 --max-variants 80
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time

import torch

from tuner import runtime
from tuner.baselines import available_baselines
from tuner.bench import time_cuda
from tuner.compiler import compile_many
from tuner.expr import evaluate
from tuner.feasibility import feasible_space
from tuner.problem import problem_from_shape
from tuner.profiles import resolve_profile
from tuner.feasibility import launch_shape
from tuner.runtime import AttentionKernel
from tuner.space import parse_variant_name
from tuner.templates import render
from tuner.verify import TOLERANCE, empty_output, make_inputs, reference, relative_error


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", action="append", required=True)
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--max-variants", type=int, default=60)
    ap.add_argument("--variant", action="append", default=[], help="always include this variant name")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rep-ms", type=float, default=50.0)
    ap.add_argument("--filter", default="True", help="manifest-style expression over the parameters, e.g. 'KV_SPLIT == 1'")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "bench_mma.jsonl"))
    args = ap.parse_args()

    runtime.cuda_driver(0)
    profile = resolve_profile("auto")
    gpu = torch.cuda.get_device_name(0)
    print(f"card: {gpu}  profile: {profile.name}  torch {torch.__version__}", flush=True)
    rows = []
    for shape in args.shape:
        problem = problem_from_shape(shape, dtype=args.dtype, causal=args.causal)
        space = [v for v in feasible_space("attn_fwd_mma", problem, profile) if evaluate(args.filter, v.params)]
        rng = random.Random(args.seed)
        forced = [parse_variant_name(n) for n in args.variant if parse_variant_name(n).head_dim == problem.head_dim]
        rest = [v for v in space if v not in forced]
        chosen = forced + rng.sample(rest, min(len(rest), max(0, args.max_variants - len(forced))))
        t0 = time.perf_counter()
        compiled = compile_many([(render(v), v.name, profile.nvcc_arch) for v in chosen], workers=os.cpu_count())
        print(f"{problem.label}: {len(space)} feasible, {len(chosen)} chosen, compiled in {time.perf_counter() - t0:.1f} s", flush=True)

        q, k, v = make_inputs(problem, seed=args.seed)
        scale = 1.0 / math.sqrt(problem.head_dim)
        ref, _ = reference(q, k, v, problem.causal, scale)
        base = {}
        for baseline in available_baselines(problem, q, k, v, scale):
            name = baseline.name
            t = baseline.time(l2_bytes=profile.l2_bytes)
            base[name] = t.median_us
            rows.append({"gpu": gpu, "problem": problem.label, "impl": name, "us": t.median_us,
                         "p20": t.p20_us, "p80": t.p80_us, "tflops": problem.tflops(t.median_us)})
            print(f"  {name:16s} {t.median_us:9.1f} us {problem.tflops(t.median_us):7.1f} TFLOP/s", flush=True)
        best_base = min(base.values()) if base else float("nan")
        results = []
        for var, res in zip(chosen, compiled):
            if not res.ok:
                print(f"  compile error {var.name}", flush=True)
                continue
            kern = AttentionKernel(res.cubin, var.name, launch_shape(var))
            out = empty_output(q)
            kern(q, k, v, out, None, scale)
            torch.cuda.synchronize()
            err = relative_error(out, ref)
            if not err < TOLERANCE[problem.dtype]:
                print(f"  INCORRECT {var.name} err={err:.2e}", flush=True)
                rows.append({"gpu": gpu, "problem": problem.label, "impl": var.name, "status": "incorrect", "err": err})
                continue
            t = time_cuda(lambda: kern.launch_unchecked(q, k, v, out, None, scale), l2_bytes=profile.l2_bytes, warmup_ms=10, rep_ms=args.rep_ms)
            results.append((t.median_us, var.name, err, res.registers, res.spill_bytes))
            rows.append({"gpu": gpu, "problem": problem.label, "impl": var.name, "us": t.median_us, "p20": t.p20_us,
                         "p80": t.p80_us, "tflops": problem.tflops(t.median_us), "err": err,
                         "regs": res.registers, "spill": res.spill_bytes})
        results.sort()
        for us, name, err, regs, spill in results[:8]:
            print(f"  {name:60s} {us:9.1f} us {problem.tflops(us):7.1f} TFLOP/s  x{best_base / us:5.2f} best SDPA "
                  f"x{base.get('sdpa_flash', float('nan')) / us:5.2f} flash  regs {regs} spill {spill} err {err:.1e}", flush=True)
        del q, k, v, ref
        torch.cuda.empty_cache()
    with open(args.out, "w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    sys.exit(main())
