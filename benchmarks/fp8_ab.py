"""FP8 against 16-bit, interleaved: FP8 variants (e4m3 q, k, v; or an FP8 KV cache, *_kv_e4m3: decode), our
16-bit variants on the same real values, and every baseline of the FP8 problem (SDPA and FlashAttention-4 on
the dequantised inputs, cuDNN's FP8 forward for e4m3 where its frontend imports), back to back, with energy
(NVML). The problem's dtype is the first variant's. A decode problem's lines add the bandwidth: the K/V bytes
each implementation must read (FP8 bytes for the FP8 variants, 16-bit for the others) per second.

Each round times every implementation once (time_cuda: back to back, L2 flushed), the first rotating; a ratio
is the median of the per-round ratios. Every variant is verified first, on a problem of the same shape with
one batch row and two K/V heads (an fp32 reference of the full problem would take a minute of GPU time):
e4m3 against the e4m3 tolerance, bf16 against bf16's, both on the dequantised values.

    python benchmarks/fp8_ab.py --shape 4,32,8192,128 --rounds 5 \\
        attn_fwd_wgmma_d128_e4m3_m128n192_s2_sw64_r24_ov_pp attn_fwd_wgmma_d128_bf16_m128n128_s2_sw128_r24_ov_pp
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
from pathlib import Path
from typing import Any, Callable

import torch

from ab_ratio import print_result, summarise
from tuner.kernels.variant import parse_variant_name
from tuner.problem import Problem, problem_from_shape
from tuner.profiles import resolve_profile
from tuner.runtime.baselines import available_baselines
from tuner.runtime.build import build
from tuner.runtime.driver import cuda_driver
from tuner.runtime.energy import EnergyMeter
from tuner.runtime.fp8 import dequantized_inputs
from tuner.runtime.timing import interleaved_timings, time_cuda
from tuner.runtime.verify import TOLERANCE, empty_output, expected_output, fp8_inputs


def _launcher(kern: Any, fp8: tuple, dtype: str) -> tuple[Callable[[bool], None], Any]:
    """(call(checked), out) of a kernel on the FP8 inputs (q, k, v, descales) or their 16-bit values."""
    q, k, v, ds = fp8
    if dtype not in ("e4m3",) and not dtype.endswith("_kv_e4m3"):
        q, k, v = dequantized_inputs(q, k, v, ds, torch.bfloat16 if dtype == "bf16" else torch.float16)
        ds = None
    out = empty_output(q)

    def call(checked: bool) -> None:
        if checked:
            kern(q, k, v, out, None, None, descales=ds)
        else:
            kern.launch_unchecked(q, k, v, out, None, None, None, ds)
    return call, out


def verified_kernels(problem: Problem, names: list[str]) -> dict[str, Any]:
    """Each variant's loaded kernel, after its check on a one-row, two-K/V-head problem of the same shape."""
    small = dataclasses.replace(problem, batch=1, heads=2 * (problem.heads // problem.heads_kv), heads_kv=2)
    inputs = fp8_inputs(small, seed=1)
    ref = expected_output(small, *inputs[:3], descales=inputs[3])
    arch = resolve_profile("auto").nvcc_arch
    kernels = {}
    for name in names:
        var = parse_variant_name(name)
        kern = build(var, arch).load()
        call, out = _launcher(kern, inputs, var.dtype)
        call(True)
        torch.cuda.synchronize()
        err = ref.error(out)
        print(f"  {name}: relative error {err:.2e} on {small.label} (tolerance {TOLERANCE[var.dtype]:g})", flush=True)
        assert err < TOLERANCE[var.dtype], (name, err)
        kernels[name] = kern
    return kernels


def measure(problem: Problem, names: list[str], rounds: int) -> dict[str, Any]:
    """ab_ratio.measure's result for e4m3 variants: the bf16 variants count as baselines beside the others."""
    profile = resolve_profile("auto")
    kernels = verified_kernels(problem, names)
    inputs = fp8_inputs(problem, seed=0)
    scale = 1.0 / math.sqrt(problem.head_dim)
    meter = EnergyMeter(0)
    timed: dict[str, Callable] = {}
    baselines = [b for b in available_baselines(problem, *inputs[:3], scale, descales=inputs[3])
                 if b.name != "sdpa_efficient"]
    for b in baselines:
        b.time(l2_bytes=profile.l2_bytes, rep_ms=10)  # warm up (FA4 and cuDNN build on their first call)
        timed[b.name] = (lambda b=b: b.time(l2_bytes=profile.l2_bytes, rep_ms=100, meter=meter))
    for name, kern in kernels.items():
        call, _ = _launcher(kern, inputs, parse_variant_name(name).dtype)
        timed[name] = (lambda call=call: time_cuda(lambda: call(False), l2_bytes=profile.l2_bytes, rep_ms=100,
                                                   meter=meter))
    fp8 = [n for n in kernels if parse_variant_name(n).dtype == problem.dtype]
    others = [b.name for b in baselines] + [n for n in kernels if n not in fp8]
    res = summarise(problem, interleaved_timings(timed, rounds), rounds, fp8, others)
    if problem.seq_q <= 16:  # decode: bandwidth in the bytes each one reads (K and V once, 16-bit for the others)
        res["kv_gbs"] = {n: problem.kv_gbs(statistics.median(t)) * (1 if n in fp8 else 2 // problem.elem_bytes)
                         for n, t in res["times_us"].items()}
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="+", help="FP8 variants (the first names the dtype), and 16-bit ones to compare "
                                                "with (same causality)")
    ap.add_argument("--shape", required=True, help="B,H,S,D or B,H,Sq,Sk,D")
    ap.add_argument("--hkv", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None, help="append the result as one JSON line")
    args = ap.parse_args()
    cuda_driver(0)
    first = parse_variant_name(args.variants[0])
    problem = problem_from_shape(args.shape, dtype=first.dtype, causal=first.causal, heads_kv=args.hkv)
    res = measure(problem, args.variants, args.rounds)
    print_result(res)
    for name, gbs in res.get("kv_gbs", {}).items():
        print(f"  {name:66s} {gbs:7.0f} GB/s of K/V")
    if args.json:
        with args.json.open("a") as f:
            f.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
