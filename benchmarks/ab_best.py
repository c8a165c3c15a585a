"""Confirm search winners: the best stored trials of each problem, timed interleaved with SDPA.

For every problem with an ok trial in the store (optionally one GPU
profile), re-times the stored best variant (or the `--top` N fastest
distinct variants: a single in-search timing drifts by a few percent)
against sdpa_flash and sdpa_cudnn in alternating rounds
(benchmarks/ab_ratio.py) and prints a markdown table, a row per variant:
the numbers for benchmarks/NOTES.md.

    python benchmarks/ab_best.py --db sqlite:///results.db [--gpu h200] [--rounds 5] [--top 3]
"""

from __future__ import annotations

import argparse

import torch
from ab_ratio import interleaved

from tuner.runtime.driver import cuda_driver
from tuner.status import TrialStatus
from tuner.store import TrialFilter, open_store

ap = argparse.ArgumentParser()
ap.add_argument("--db", required=True)
ap.add_argument("--gpu", default=None)
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--top", type=int, default=1, help="re-time this many of the fastest distinct variants per problem")
args = ap.parse_args()


def fastest_names(store, trial, n: int) -> list[str]:
    """The n fastest distinct variants stored for this trial's problem (and GPU profile filter)."""
    p = trial.problem
    rows = store.query_trials(TrialFilter(gpu=args.gpu, problem=p, status=TrialStatus.OK))
    names: list[str] = []
    for row in sorted((r for r in rows if r.median_us is not None), key=lambda r: r.median_us):
        if row.variant_name not in names:
            names.append(row.variant_name)
    return names[:n] or [trial.variant_name]


cuda_driver(0)
with open_store(args.db, create=False) as store:
    best = store.best_trials(TrialFilter(gpu=args.gpu))
    candidates = {trial.id: fastest_names(store, trial, args.top) for trial in best}
print(f"{torch.cuda.get_device_name(0)}, {args.rounds} interleaved rounds, median per-round ratio (min-max)\n")
print("| problem | tuned variant | µs | TFLOP/s | sdpa_cudnn µs | x cudnn | sdpa_flash µs | x flash |")
print("|---|---|---|---|---|---|---|---|")
for trial in best:
    names = candidates[trial.id]
    rows = {r.name: r for r in interleaved(trial.problem, names, args.rounds)}
    for name in names:
        mine = rows[name]
        cells = []
        for b in ("sdpa_cudnn", "sdpa_flash"):
            if b in rows:
                med, lo, hi = mine.ratios[b]
                cells += [f"{rows[b].median_us:.1f}", f"**{med:.3f}** ({lo:.2f}-{hi:.2f})"]
            else:
                cells += ["-", "-"]
        print(f"| {trial.problem.label} | {name} | {mine.median_us:.1f} | {mine.tflops:.1f} | "
              + " | ".join(cells) + " |", flush=True)
