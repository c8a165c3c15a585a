"""Decode attention at the memory-bandwidth limit: the store's best decode kernels against SDPA, one process.

    python benchmarks/decode_bench.py --db sqlite:///results.db [--gpu h100] [--rounds 7] [--json out.json]

For each problem of issue 15's targets that the store has tuned (B8 H32 Hkv8 Sq1 Sk8192 D128 bf16,
B1 Sk32768, B64 Sk1024, Sq4 of the first, and the first as a ragged batch: lengths uniform:1024), the
best ok trial (the confirmed one when there is one) is rebuilt, verified against the fp32 reference and
timed with every SDPA backend in interleaved rounds (the start rotates; L2 flushed before each
repetition, as trials are timed). Reported: the median µs, the K/V bytes the step must read (a ragged
batch: each row's own keys), GB/s and the fraction of the profile's HBM bandwidth, and the median
per-round ratio to each backend (FlashAttention-4 too, where flash_attn.cute imports; SDPA takes a
ragged batch as a mask). A ragged problem's table row also times the full-length problem's kernel on
the same batch ("dense-tuned"): what tuning for the distribution bought.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any

from tuner.kernels.variant import Variant
from tuner.problem import Problem
from tuner.profiles import load_profile
from tuner.runtime.baselines import available_baselines
from tuner.runtime.build import build
from tuner.runtime.driver import cuda_driver
from tuner.runtime.timing import interleaved_rounds, per_round_ratio, time_cuda
from tuner.runtime.verify import TOLERANCE, empty_output, make_inputs, ragged_seq_lens, reference, relative_error
from tuner.store import TrialFilter, open_store

TARGETS = [  # (problem, fraction of HBM bandwidth the issue asks for)
    (Problem(8, 32, 1, 8192, 128, dtype="bf16", heads_kv=8), 0.90),
    (Problem(1, 32, 1, 32768, 128, dtype="bf16", heads_kv=8), 0.85),
    (Problem(64, 32, 1, 1024, 128, dtype="bf16", heads_kv=8), 0.75),
    (Problem(8, 32, 4, 8192, 128, dtype="bf16", heads_kv=8), None),  # Sq 4: within 1.3x of the Sq 1 time
    (Problem(8, 32, 1, 8192, 128, dtype="bf16", heads_kv=8, lengths="uniform:1024"), None),  # a ragged batch
]


def best_trial(store: Any, gpu: str, p: Problem) -> Any:
    rows = store.prefer_confirmed(store.best_trials(TrialFilter(gpu=gpu, shape=(p.batch, p.heads, p.seq_q, p.seq_k,
                                                                                p.head_dim), dtype=p.dtype)))
    rows = [r for r in rows if r.problem == p]
    return rows[0] if rows else None


def measure(p: Problem, row: Any, arch: str, rounds: int, l2_bytes: int, dense_row: Any = None) -> dict[str, Any]:
    q, k, v = make_inputs(p, seed=0)
    lengths = p.key_lengths() if p.ragged else None
    lens = ragged_seq_lens(p, "cuda")
    ref, _ = reference(q, k, v, p.causal, key_lengths=lengths)
    calls, names, errors = {}, {}, {}
    for label, r in (("tuned", row), ("dense-tuned", dense_row)):
        if r is None:
            continue
        built = build(Variant.from_stored(r.template, r.params), arch)
        kernel, out = built.load(), empty_output(q)
        kernel(q, k, v, out, seq_lens=lens)
        err = errors[label] = relative_error(out, ref)
        assert err < TOLERANCE[p.dtype], f"{built.variant.name} on {p.label}: rel error {err:.2e}"
        calls[label] = (lambda kernel=kernel, out=out: time_cuda(
            lambda: kernel.launch_unchecked(q, k, v, out, None, None, lens), l2_bytes=l2_bytes))
        names[label] = built.variant.name
    for b in available_baselines(p, q, k, v):
        calls[b.name] = lambda b=b: b.time(l2_bytes=l2_bytes)
    times = interleaved_rounds(calls, rounds)
    us = statistics.median(times["tuned"])
    return {"problem": p.label, "variant": names["tuned"], "us": us, "kv_bytes": p.kv_bytes,
            "gbs": p.kv_gbs(us), "rel_error": errors["tuned"], "dense_tuned_variant": names.get("dense-tuned"),
            "baselines_us": {n: statistics.median(t) for n, t in times.items() if n != "tuned"},
            "ratios": {n: per_round_ratio(t, times["tuned"]) for n, t in times.items() if n != "tuned"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json")
    args = parser.parse_args()
    import torch

    profile = load_profile(args.gpu)
    cuda_driver(0)
    results = []
    with open_store(args.db, create=False) as store:
        chosen = [(p, goal, best_trial(store, profile.name, p),
                   best_trial(store, profile.name, dataclasses.replace(p, lengths="full")) if p.ragged else None)
                  for p, goal in TARGETS]
    for p, goal, row, dense_row in chosen:
        if row is None:
            print(f"{p.label}: not tuned in this store, skipped")
            continue
        res = measure(p, row, profile.nvcc_arch, args.rounds, profile.l2_bytes, dense_row)
        res["fraction_of_peak"] = res["gbs"] / profile.mem_bandwidth_gbs
        res["goal"] = goal
        results.append(res)
        print(json.dumps(res), flush=True)
    print(f"\n{torch.cuda.get_device_name()}, {args.rounds} interleaved rounds, L2 flushed; peak "
          f"{profile.mem_bandwidth_gbs:.0f} GB/s\n")
    columns = ("sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "fa4", "dense-tuned")
    print("| problem | variant | µs | K/V MB | GB/s | of peak (goal) | vs cuDNN | vs flash | vs efficient | vs FA4 "
          "| vs dense-tuned |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        goal = f" ({r['goal']:.0%})" if r["goal"] else ""
        ratios = " | ".join(f"{r['ratios'][n]:.2f}x" if n in r["ratios"] else "n/a" for n in columns)
        print(f"| {r['problem']} | {r['variant'].split('_', 4)[-1]} | {r['us']:.1f} | {r['kv_bytes'] / 1e6:.0f} | "
              f"{r['gbs']:.0f} | {r['fraction_of_peak']:.0%}{goal} | {ratios} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
