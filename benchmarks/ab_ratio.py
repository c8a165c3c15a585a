"""Interleaved A/B timing: variants and SDPA backends timed in alternation, several rounds.

A single timing of a ~1 ms kernel moved by ±3-5% between runs on the H200;
alternating rounds in one process and taking the median per-round ratio
gives a ratio that is robust to that drift. Every variant is verified
against the fp32 reference first.

    python benchmarks/ab_ratio.py --shape 8,16,2048,128 --rounds 7 VARIANT [VARIANT ...]
"""

from __future__ import annotations

import argparse
import math
import statistics
from dataclasses import dataclass

import torch

from tuner.kernels.variant import parse_variant_name
from tuner.problem import Problem, problem_from_shape
from tuner.profiles import resolve_profile
from tuner.runtime.baselines import available_baselines
from tuner.runtime.build import build
from tuner.runtime.driver import cuda_driver
from tuner.runtime.timing import time_cuda
from tuner.runtime.verify import TOLERANCE, empty_output, make_inputs, reference, relative_error


@dataclass
class Row:
    name: str
    median_us: float
    tflops: float
    ratios: dict[str, tuple[float, float, float]]  # baseline -> (median, min, max) of per-round ratios


def interleaved(problem: Problem, variants: list[str], rounds: int) -> list[Row]:
    """Baselines first, then each variant, `rounds` times over; median per-round ratios."""
    profile = resolve_profile("auto")
    q, k, v = make_inputs(problem, seed=0)
    scale = 1.0 / math.sqrt(problem.head_dim)
    ref, _ = reference(q, k, v, problem.causal, scale)
    calls = {}
    for name in variants:
        var = parse_variant_name(name)
        kern = build(var, profile.nvcc_arch).load()
        out = empty_output(q)
        kern(q, k, v, out, None, scale)
        torch.cuda.synchronize()
        err = relative_error(out, ref)
        assert err < TOLERANCE[problem.dtype], (name, err)
        calls[name] = (lambda kern=kern, out=out: kern.launch_unchecked(q, k, v, out, None, scale))
    baselines = {b.name: b for b in available_baselines(problem, q, k, v, scale) if b.name != "sdpa_efficient"}
    times: dict[str, list[float]] = {n: [] for n in [*baselines, *calls]}
    for _ in range(rounds):
        for name, b in baselines.items():
            times[name].append(b.time(l2_bytes=profile.l2_bytes, rep_ms=60).median_us)
        for name, call in calls.items():
            times[name].append(time_cuda(call, l2_bytes=profile.l2_bytes, rep_ms=60).median_us)
    rows = []
    for name, ts in times.items():
        med = statistics.median(ts)
        ratios = {}
        if name in calls:
            for b in baselines:
                per_round = [bt / t for bt, t in zip(times[b], ts)]
                ratios[b] = (statistics.median(per_round), min(per_round), max(per_round))
        rows.append(Row(name, med, problem.tflops(med), ratios))
    return rows


def print_rows(rows: list[Row]) -> None:
    for row in rows:
        line = f"  {row.name:62s} median {row.median_us:8.1f} us ({row.tflops:6.1f} TFLOP/s)"
        for b, (med, lo, hi) in row.ratios.items():
            line += f"  x{med:.3f} {b} ({lo:.3f}-{hi:.3f})"
        print(line, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="+")
    ap.add_argument("--shape", required=True)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    cuda_driver(0)
    first = parse_variant_name(args.variants[0])
    problem = problem_from_shape(args.shape, dtype=first.dtype, causal=first.causal)
    print(f"{torch.cuda.get_device_name(0)} {problem.label}, {args.rounds} interleaved rounds")
    print_rows(interleaved(problem, args.variants, args.rounds))


if __name__ == "__main__":
    main()
