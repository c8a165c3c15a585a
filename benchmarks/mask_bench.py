"""Variants of a windowed or softcapped problem against FlashAttention-4 (window_size=, softcap=) and SDPA with
the equivalent boolean mask (no SDPA for a softcap: it has none), in interleaved rounds, back to back, with
energy. Every implementation is checked against the fp32 reference first (FA4 and SDPA too).

    python benchmarks/mask_bench.py --shape 1,32,16384,128 --hkv 8 --dtype bf16 --causal --window 4096 \\
        m128n128_s2_sw128_r24_ov_pp m128n128_s2_sw128_r24_ov_pp_p        # tunables (short names)
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any, Callable

import torch

from tuner.kernels.variant import full_name, parse_variant_name, variant_from_params
from tuner.problem import Problem, parse_window, problem_from_shape
from tuner.profiles import resolve_profile
from tuner.runtime.build import build
from tuner.runtime.driver import cuda_driver
from tuner.runtime.energy import EnergyMeter
from tuner.runtime.timing import interleaved_timings, per_round_ratio, time_cuda
from tuner.runtime.baselines import sdpa_mask
from tuner.runtime.verify import TOLERANCE, empty_output, make_inputs, problem_reference, relative_error


def _check(label: str, out: Any, ref: Any, dtype: str) -> None:
    err = relative_error(out, ref)
    print(f"  {label}: relative error {err:.2e}", flush=True)
    assert err < TOLERANCE[dtype], (label, err)


def implementations(problem: Problem, shorts: list[str]) -> dict[str, Callable[[], Any]]:
    """Our variants, FA4 and SDPA (where it can), each verified; name -> a call that runs it once."""
    q, k, v = make_inputs(problem, seed=0)
    scale = 1.0 / math.sqrt(problem.head_dim)
    ref, _ = problem_reference(problem, q, k, v, scale)
    calls: dict[str, Callable[[], Any]] = {}
    for short in shorts:
        base = parse_variant_name(full_name(short, "attn_fwd_wgmma", problem.head_dim, problem.dtype) +
                                  ("_causal" if problem.causal else ""))
        variant = variant_from_params("attn_fwd_wgmma", problem, base.params)
        kern = build(variant, resolve_profile("auto").nvcc_arch).load()
        out = empty_output(q)
        kern(q, k, v, out, None, scale)
        torch.cuda.synchronize()
        _check(variant.name, out, ref, problem.dtype)
        calls[variant.name] = lambda kern=kern, out=out: kern.launch_unchecked(q, k, v, out, None, scale)
    try:
        from flash_attn.cute import flash_attn_func

        qb, kb, vb = (t.transpose(1, 2) for t in (q, k, v))
        left = problem.window_left if problem.window_left >= 0 else None
        right = 0 if problem.causal and problem.local else (problem.window_right if problem.window_right >= 0 else None)
        fa4 = lambda: flash_attn_func(qb, kb, vb, softmax_scale=scale, causal=problem.causal,  # noqa: E731
                                      window_size=(left, right), softcap=problem.softcap, num_splits=1)
        res = fa4()
        torch.cuda.synchronize()
        _check("fa4", (res[0] if isinstance(res, tuple) else res).transpose(1, 2), ref, problem.dtype)
        calls["fa4"] = fa4
    except ImportError as exc:
        print(f"  no FA4: {exc}")
    if not problem.softcap:
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        mask = sdpa_mask(problem, q.device)
        for name, backend in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_efficient", SDPBackend.EFFICIENT_ATTENTION)):
            def sdpa(backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                                          enable_gqa=problem.heads_kv != problem.heads)
            try:
                _check(name, sdpa(), ref, problem.dtype)
                calls[name] = sdpa
            except RuntimeError as exc:
                print(f"  no {name}: {str(exc).splitlines()[0][:100]}")
    return calls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="+", help="tunables parts of attn_fwd_wgmma names")
    ap.add_argument("--shape", required=True)
    ap.add_argument("--hkv", type=int, default=None)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--window", default=None)
    ap.add_argument("--softcap", type=float, default=0.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    cuda_driver(0)
    problem = problem_from_shape(args.shape, dtype=args.dtype, causal=args.causal, heads_kv=args.hkv,
                                 window=parse_window(args.window) if args.window else (-1, -1), softcap=args.softcap)
    print(problem.label, flush=True)
    calls = implementations(problem, args.variants)
    l2 = resolve_profile("auto").l2_bytes
    meter = EnergyMeter(0)
    for fn in calls.values():
        time_cuda(fn, l2_bytes=l2, rep_ms=10)
    timings = interleaved_timings({n: (lambda fn=fn: time_cuda(fn, l2_bytes=l2, rep_ms=100, meter=meter))
                                   for n, fn in calls.items()}, args.rounds)
    times = {n: [t.median_us for t in ts] for n, ts in timings.items()}
    joules = {n: [t.energy.joules_per_call if t.energy else math.nan for t in ts] for n, ts in timings.items()}
    baselines = [n for n in calls if not n.startswith("attn_")]
    print(f"{torch.cuda.get_device_name(0)} {problem.label}, {args.rounds} interleaved rounds (back to back)")
    for n in calls:
        line = (f"  {n:70s} {statistics.median(times[n]):8.1f} us {problem.tflops(statistics.median(times[n])):6.1f}"
                f" TFLOP/s {statistics.median(joules[n]) * 1e3:7.1f} mJ")
        if n.startswith("attn_"):
            line += "".join(f"  {per_round_ratio(times[b], times[n]):.3f}x {b} (J {per_round_ratio(joules[b], joules[n]):.3f}x)"
                            for b in baselines)
        print(line, flush=True)
    if args.json:
        with args.json.open("a") as f:
            f.write(json.dumps({"problem": problem.label, "gpu": torch.cuda.get_device_name(0), "times_us": times,
                                "joules": joules}) + "\n")


if __name__ == "__main__":
    main()
