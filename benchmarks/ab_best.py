"""Confirm search winners: the best stored trial of each problem, timed interleaved with SDPA.

For every problem with an ok trial in the store (optionally one GPU
profile), re-times the stored best variant against sdpa_flash and
sdpa_cudnn in alternating rounds (benchmarks/ab_ratio.py) and prints a
markdown table: the numbers for benchmarks/NOTES.md.

    python benchmarks/ab_best.py --db sqlite:///results.db [--gpu h200] [--rounds 5]
"""

from __future__ import annotations

import argparse

import torch
from ab_ratio import interleaved

from tuner import runtime
from tuner.store import TrialFilter, open_store

ap = argparse.ArgumentParser()
ap.add_argument("--db", required=True)
ap.add_argument("--gpu", default=None)
ap.add_argument("--rounds", type=int, default=5)
args = ap.parse_args()

runtime.cuda_driver(0)
with open_store(args.db, create=False) as store:
    best = store.best_trials(TrialFilter(gpu=args.gpu))
print(f"{torch.cuda.get_device_name(0)}, {args.rounds} interleaved rounds, median per-round ratio (min-max)\n")
print("| problem | tuned variant | µs | TFLOP/s | sdpa_cudnn µs | x cudnn | sdpa_flash µs | x flash |")
print("|---|---|---|---|---|---|---|---|")
for trial in best:
    rows = {r.name: r for r in interleaved(trial.problem, [trial.variant_name], args.rounds)}
    mine = rows[trial.variant_name]
    cells = []
    for b in ("sdpa_cudnn", "sdpa_flash"):
        if b in rows:
            med, lo, hi = mine.ratios[b]
            cells += [f"{rows[b].median_us:.1f}", f"**{med:.3f}** ({lo:.2f}-{hi:.2f})"]
        else:
            cells += ["-", "-"]
    print(f"| {trial.problem.label} | {trial.variant_name} | {mine.median_us:.1f} | {mine.tflops:.1f} | "
          + " | ".join(cells) + " |", flush=True)
