"""Interleaved A/B timing: variants (and, with --old-cubins, the same variants built from an earlier template
revision, --cubins) against every baseline (SDPA backends, FlashAttention-4 where it imports), back to back.

A single timing of a ~0.5 ms kernel drifts by up to 5% between calls and cards; each round times every
implementation once (time_cuda: back to back, the card at its power limit, L2 flushed between
repetitions), the first one rotating, and a ratio is the median of the per-round ratios. Every variant
is verified against the fp32 reference first.

    python benchmarks/ab_ratio.py --shape 8,16,2048,128 --rounds 7 VARIANT [VARIANT ...]
    python benchmarks/ab_ratio.py --shape 1,32,16384,128 --hkv 8 --cubins old=.ab/old VARIANT   # old vs new
    python benchmarks/ab_ratio.py --shape 1,32,16384,128 --hkv 8 attn_fwd_wgmma_d128_bf16_..._causal_wl4096
    python benchmarks/ab_ratio.py --shape 16,32,4096,128 --hkv 8 --lengths uniform:64 ..._causal_packed

Packed variants (name suffix _packed) make a packed problem: B sequences of --lengths, timed on their packed
copies, against SDPA once per sequence and FlashAttention-4's varlen call (tuner.runtime.packed).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any, Callable

import torch

from tuner.kernels.variant import parse_variant_name
from tuner.problem import Problem, problem_from_shape
from tuner.profiles import resolve_profile
from tuner.runtime.baselines import available_baselines
from tuner.runtime.build import build, launch_shape
from tuner.runtime.driver import cuda_driver
from tuner.runtime.shipped.launcher import AttentionKernel
from tuner.runtime.energy import EnergyMeter
from tuner.runtime.packed import packed_call, packed_inputs
from tuner.runtime.timing import interleaved_timings, per_round_ratio, time_cuda
from tuner.runtime.verify import TOLERANCE, Expected, empty_output, expected_output, fp8_inputs, make_inputs


def _checked_call(kern: Any, q: Any, k: Any, v: Any, ref: Expected, scale: float, dtype: str, label: str,
                  packed: Any = None, descales: Any = None) -> Callable:
    """The kernel's unchecked launch, after one checked launch verified against `ref` (packed: on the packed
    copies, scattered back to be checked; FP8 inputs with their descales)."""
    out = empty_output(q)
    if packed is not None:
        data = {"packed": packed, "scale": scale}
        packed_call(kern, data, out, checked=True)()
    else:
        kern(q, k, v, out, None, scale, descales=descales)
    torch.cuda.synchronize()
    err = ref.error(out)
    assert err < TOLERANCE[dtype], (label, err)
    print(f"  {label}: relative error {err:.2e}", flush=True)
    if packed is not None:
        return packed_call(kern, data, out, checked=False)
    return lambda: kern.launch_unchecked(q, k, v, out, None, scale, None, descales)


def measure(problem: Problem, variants: list[str], rounds: int, cubins: dict[str, Path]) -> dict[str, Any]:
    """Every implementation's median µs per round, its energy per round (J per call, W, MHz; NVML), and the
    per-round ratios of each kernel to each baseline, in time and in energy."""
    profile = resolve_profile("auto")
    descales = None
    if problem.fp8:  # e4m3: the kernels, the reference and the baselines all need the inputs' descales
        q, k, v, descales = fp8_inputs(problem, seed=0)
    else:
        q, k, v = make_inputs(problem, seed=0)
    scale = 1.0 / math.sqrt(problem.head_dim)
    ref = expected_output(problem, q, k, v, scale, descales=descales)  # sampled query rows at 128K
    packed = packed_inputs(problem, q, k, v) if problem.packed else None
    calls: dict[str, Callable] = {}
    for name in variants:
        var = parse_variant_name(name)
        calls[name] = _checked_call(build(var, profile.nvcc_arch).load(), q, k, v, ref, scale, problem.dtype, name,
                                    packed, descales)
        for label, folder in cubins.items():  # the same variant built from other template revisions
            other = AttentionKernel((folder / f"{name}.cubin").read_bytes(), name, launch_shape(var), 0)
            calls[f"{name}@{label}"] = _checked_call(other, q, k, v, ref, scale, problem.dtype, f"{name}@{label}",
                                                      packed, descales)
    baselines = {b.name: b for b in available_baselines(problem, q, k, v, scale, descales=descales) if b.name != "sdpa_efficient"}
    timed: dict[str, Callable] = {}
    meter = EnergyMeter(0)
    for name, b in baselines.items():
        b.time(l2_bytes=profile.l2_bytes, rep_ms=10)  # warm up (FA4 compiles on its first call)
        timed[name] = (lambda b=b: b.time(l2_bytes=profile.l2_bytes, rep_ms=100, meter=meter))
    for name, call in calls.items():
        timed[name] = (lambda call=call: time_cuda(call, l2_bytes=profile.l2_bytes, rep_ms=100, meter=meter))
    return summarise(problem, interleaved_timings(timed, rounds), rounds, list(calls), list(baselines))


def summarise(problem: Problem, timings: dict[str, list[Any]], rounds: int, kernels: list[str],
              baselines: list[str]) -> dict[str, Any]:
    """The result of interleaved timings: each implementation's µs and energy per round, TFLOP/s, and the
    per-round ratios of each of `kernels` to each of `baselines`, in time and (where NVML gave it) energy."""
    times = {n: [t.median_us for t in ts] for n, ts in timings.items()}
    energy = {n: [[t.energy.joules_per_call, t.energy.power_w, t.energy.sm_mhz] if t.energy else None for t in ts]
              for n, ts in timings.items()}
    res = {"problem": problem.label, "gpu": torch.cuda.get_device_name(0), "rounds": rounds, "times_us": times,
           "energy_j_w_mhz": energy,
           "ratios": {n: {b: per_round_ratio(times[b], times[n]) for b in baselines} for n in kernels},
           "tflops": {n: problem.tflops(statistics.median(t)) for n, t in times.items()}}
    if all(e is not None for es in energy.values() for e in es):
        joules = {n: [e[0] for e in es] for n, es in energy.items()}
        res["energy_ratios"] = {n: {b: per_round_ratio(joules[b], joules[n]) for b in baselines} for n in kernels}
    return res


def print_result(res: dict[str, Any]) -> None:
    print(f"{res['gpu']} {res['problem']}, {res['rounds']} interleaved rounds (back to back)")
    for name, ts in res["times_us"].items():
        line = f"  {name:66s} {statistics.median(ts):8.1f} us {res['tflops'][name]:6.1f} TFLOP/s"
        rounds = [e for e in res["energy_j_w_mhz"][name] if e is not None]
        if rounds:
            line += (f" {statistics.median(e[0] for e in rounds) * 1e3:7.1f} mJ"
                     f" {statistics.median(e[1] for e in rounds):5.0f} W"
                     f" {statistics.median(e[2] or 0 for e in rounds):5.0f} MHz")
        for b, r in res["ratios"].get(name, {}).items():
            line += f"  {r:.3f}x {b}"
            if "energy_ratios" in res:
                line += f" (J {res['energy_ratios'][name][b]:.3f}x)"
        print(line, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="+")
    ap.add_argument("--shape", required=True, help="B,H,S,D or B,H,Sq,Sk,D")
    ap.add_argument("--hkv", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--lengths", default="full", help="packed variants: each sequence's length, e.g. uniform:64")
    ap.add_argument("--cubins", action="append", default=[], metavar="LABEL=DIR",
                    help="time <variant>.cubin of DIR (from build_cubins.py) too, as <variant>@LABEL; repeatable")
    ap.add_argument("--json", type=Path, default=None, help="append the result as one JSON line")
    args = ap.parse_args()
    cuda_driver(0)
    first = parse_variant_name(args.variants[0])
    # The variants' compiled-in features make the problem: a window or softcap too (FA4 gets them, SDPA the
    # window as a mask; a softcap has no SDPA baseline).
    problem = problem_from_shape(args.shape, dtype=first.dtype, causal=first.causal, heads_kv=args.hkv,
                                 window=(first.window_left, first.window_right), softcap=first.softcap,
                                 layout="packed" if first.packed else "bhsd", lengths=args.lengths)
    cubins = {label: Path(folder) for label, _, folder in (c.partition("=") for c in args.cubins)}
    res = measure(problem, args.variants, args.rounds, cubins)
    print_result(res)
    if args.json:
        with args.json.open("a") as f:
            f.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
