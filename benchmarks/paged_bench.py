"""A paged K/V cache against the dense one: the same tuned decode kernel, one process.

    python benchmarks/paged_bench.py --db sqlite:///results.db [--paged-db URL] [--gpu h100] [--rounds 7]
                                     [--json out.json]

The store's best decode trial for B8 H32 Hkv8 Sq1 Sk8192 D128 bf16 (causal or not: one query sees every
key) is rebuilt and timed on the dense cache and on paged caches of 16 to 256 rows a page (vLLM's
layout, the pages in shuffled order, the lengths read from seq_lens), with SDPA cuDNN and flash on the
dense cache, all in interleaved rounds (L2 flushed before each repetition, as trials are timed). Every
paged result is checked against the dense one first. Issue 15 asks for the paged layout within 5% of
the dense one at page size 64. With --paged-db, the best trial of each paged layout searched there
(`tuner search --layout pagedN`) runs on its own layout too ("pageN tuned"), in the same rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from tuner.kernels.variant import Variant
from tuner.problem import Problem
from tuner.profiles import load_profile
from tuner.runtime.baselines import available_baselines
from tuner.runtime.build import build
from tuner.runtime.driver import cuda_driver
from tuner.runtime.timing import interleaved_rounds, per_round_ratio, time_cuda
from tuner.runtime.verify import empty_output, make_inputs, paged_inputs
from tuner.store import TrialFilter, open_store

PROBLEM = Problem(8, 32, 1, 8192, 128, dtype="bf16", heads_kv=8)
PAGES = (16, 32, 64, 128, 256)


def decode_trials(url: str, gpu: str, p: Problem) -> list[Any]:
    """The store's decode trials of p's shape, best first (confirmed preferred), any causality or layout."""
    with open_store(url, create=False) as store:
        rows = store.prefer_confirmed(store.best_trials(TrialFilter(
            gpu=gpu, shape=(p.batch, p.heads, p.seq_q, p.seq_k, p.head_dim), dtype=p.dtype)))
    return [r for r in rows if r.template == "attn_decode" and r.problem.heads_kv == p.heads_kv]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--paged-db", help="a store with `tuner search --layout pagedN` trials of the problem")
    parser.add_argument("--json")
    args = parser.parse_args()
    import torch

    profile = load_profile(args.gpu)
    cuda_driver(0)
    p = PROBLEM
    rows = decode_trials(args.db, profile.name, p)
    rows = [r for r in rows if r.problem.page_size == 0]
    if not rows:
        raise SystemExit(f"no tuned attn_decode trial for {p.label} (dense) in {args.db}")
    built = build(Variant.from_stored(rows[0].template, rows[0].params), profile.nvcc_arch)
    paged_tuned = {r.problem.page_size: r for r in reversed(decode_trials(args.paged_db, profile.name, p))
                   if r.problem.page_size} if args.paged_db else {}
    kernel = built.load()
    q, k, v = make_inputs(p, seed=0)
    lens = torch.full((p.batch,), p.seq_k, dtype=torch.int32, device="cuda")
    dense = empty_output(q)
    kernel(q, k, v, dense, seq_lens=lens)
    l2 = profile.l2_bytes
    calls = {"dense": lambda: time_cuda(lambda: kernel.launch_unchecked(q, k, v, dense, seq_lens=lens), l2_bytes=l2)}
    for page in PAGES:
        paged = paged_inputs(replace(p, layout=f"paged{page}"), k, v, seed=page)
        kc, vc, table = paged["k_cache"], paged["v_cache"], paged["block_table"]
        out = empty_output(q)
        kernel.paged(q, kc, vc, out, table, lens)
        torch.cuda.synchronize()
        diff = (out.float() - dense.float()).abs().max().item()
        assert diff == 0.0, f"page {page}: paged differs from dense by {diff}"  # the same tiles, the same sums
        calls[f"page{page}"] = (lambda kc=kc, vc=vc, out=out, table=table: time_cuda(
            lambda: kernel.paged(q, kc, vc, out, table, lens, check=False), l2_bytes=l2))
        if page in paged_tuned:  # the kernel searched on this layout, on the same pages
            row = paged_tuned[page]
            tuned = build(Variant.from_stored(row.template, row.params), profile.nvcc_arch).load()
            out2 = empty_output(q)
            tuned.paged(q, kc, vc, out2, table, lens)
            torch.cuda.synchronize()
            assert (out2.float() - dense.float()).abs().max().item() < 2e-2, f"page {page} tuned kernel differs"
            calls[f"page{page} tuned"] = (lambda tuned=tuned, kc=kc, vc=vc, out2=out2, table=table: time_cuda(
                lambda: tuned.paged(q, kc, vc, out2, table, lens, check=False), l2_bytes=l2))
    for b in available_baselines(p, q, k, v, fa4=False):
        calls[b.name] = lambda b=b: b.time(l2_bytes=l2)
    times = interleaved_rounds(calls, args.rounds)
    kv_bytes = p.kv_bytes
    result = {"gpu": torch.cuda.get_device_name(), "problem": p.label, "variant": built.variant.name,
              "rounds": args.rounds, "kv_bytes": kv_bytes, "rows": []}
    for name, t in times.items():
        us = statistics.median(t)
        result["rows"].append({"layout": name, "us": us, "gbs": kv_bytes / us / 1e3,
                               "fraction_of_peak": kv_bytes / us / 1e3 / profile.mem_bandwidth_gbs,
                               "vs_dense": per_round_ratio(t, times["dense"])})  # > 1: slower than dense
        print(json.dumps(result["rows"][-1]), flush=True)
    print(f"\n{result['gpu']}, {p.label}, {built.variant.name}; {args.rounds} interleaved rounds, L2 flushed\n")
    print("| layout | µs | GB/s | of HBM peak | time vs dense kernel |")
    print("|---|---|---|---|---|")
    for r in result["rows"]:
        print(f"| {r['layout']} | {r['us']:.1f} | {r['gbs']:.0f} | {r['fraction_of_peak']:.0%} | {r['vs_dense']:.3f}x |")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
