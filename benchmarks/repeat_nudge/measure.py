"""Asks per measured trial and the winner, with and without the idle nudge (issue 38; NOTES, session 25).

For each problem and seed, a full replayed search (tpe, --trials budget, no warm start, no early stop, no confirm
stage) through the real `run_search` on a synthetic recording (`write_synthetic_recording`: every feasible variant,
made-up timings), once with `IDLE_NUDGE` = 0 (before: only the infeasible nudge) and once with the value given.
Per run: asks (measured + reused + repeats + infeasible points) per budgeted trial, the search's CPU seconds
(`time.process_time`, parent and compile threads alike: the replay backend measures in-process, no delay) and its
time breakdown's "asking the sampler"; the final best (the true, recorded µs of the variant with the best seen
figure) and the budgeted trials it took to come within 1% of that run's final best.

    PYTHONPATH=. python benchmarks/repeat_nudge/measure.py --seeds 8 --nudge 4 --out /tmp/nudge.json

(PYTHONPATH: the venv installs /work/main's package; a worktree's own is measured only with it.)
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Optional, Sequence

import optuna
from rich.console import Console

import tuner.search.nudge as nudges
from tuner.backends.synthetic import write_synthetic_recording
from tuner.problem import Problem
from tuner.search.early_stop import budgeted_values
from tuner.search.job import ASKING
from tuner.search.options import SearchOptions
from tuner.search.run import run_search
from tuner.search.study import ATTR_VARIANT, counts_toward_budget, opened_storage
from tuner.store import TrialFilter, open_store

WITHIN = 0.01
# (label, template, problem, SearchOptions fields): qwen2.5-7b's decode at Sk8192 and one of its prefill problems.
PROBLEMS = (
    ("decode B8 H28 Hkv4 Sq1 Sk8192", "attn_decode", Problem(8, 28, 1, 8192, 128, dtype="bf16", causal=True, heads_kv=4),
     dict(shapes=("8,28,1,8192,128",))),
    ("prefill B1 H28 Hkv4 S4096", "attn_fwd_wgmma", Problem(1, 28, 4096, 4096, 128, dtype="bf16", causal=True,
                                                             heads_kv=4), dict(shapes=("1,28,4096,4096,128",))),
)


def recording(tmp: str) -> str:
    url = f"sqlite:///{os.path.join(tmp, 'synthetic.db')}"
    for _, template, problem, _ in PROBLEMS:
        write_synthetic_recording(url, [problem], profile="h200", template=template, gpu_name="NVIDIA H200")
    return url


def true_us(url: str) -> dict[str, float]:
    """Each recorded ok variant's µs, by (problem label, variant name)."""
    with open_store(url, create=False) as store:
        return {f"{r.problem.label}|{r.variant_name}": r.median_us for r in store.query_trials(TrialFilter())
                if r.median_us is not None}


def one(url: str, truth: dict[str, float], label: str, template: str, problem: Problem, fields: dict, seed: int,
        trials: int, nudge: int, gpu: str = "h200") -> dict[str, object]:
    nudges.IDLE_NUDGE = nudge
    nudges.IDLE_NUDGE_TEMPLATES = (template,)  # measured on any template, whichever it serves by default
    with tempfile.TemporaryDirectory(prefix="tuner-nudge-") as tmp:
        db_url = f"sqlite:///{os.path.join(tmp, 'results.db')}"
        options = SearchOptions(gpu=gpu, heads_kv=problem.heads_kv, dtype=problem.dtype, causal=problem.causal,
                                template=template, trials=trials, sampler="tpe", seed=seed, db_url=db_url,
                                backend="replay", replay_from=url, warm_start=0, confirm=0, **fields)
        cpu, wall = time.process_time(), time.perf_counter()
        report = run_search(options, console=Console(file=io.StringIO()))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        with opened_storage(db_url, create=False) as storage:
            study = optuna.load_study(study_name=report.studies[0], storage=storage)
            values = budgeted_values(study)
            names = [t.user_attrs.get(ATTR_VARIANT) for t in sorted(
                (t for t in study.get_trials(deepcopy=False) if counts_toward_budget(t)), key=lambda t: t.number)]
    curve: list[Optional[float]] = []  # true µs of the in-search best after each budgeted trial
    best: Optional[tuple[float, str]] = None
    for value, name in zip(values, names):
        if value is not None and (best is None or value < best[0]):
            best = (value, name)
        curve.append(None if best is None else truth.get(f"{problem.label}|{best[1]}", best[0]))
    final = curve[-1] if curve else None
    reach = next((i + 1 for i, c in enumerate(curve) if c is not None and final is not None
                  and c <= final * (1 + WITHIN)), None)
    asks = report.measured + report.reused + report.repeated + report.infeasible
    return dict(problem=label, seed=seed, nudge=nudge, trials=len(values), asks=asks, repeated=report.repeated,
                infeasible=report.infeasible, asks_per_trial=asks / max(1, len(values)), cpu_s=cpu, wall_s=wall,
                asking_s=dict(report.seconds).get(ASKING, 0.0), final_us=final, reach=reach)


def table(rows: list[dict]) -> None:
    print("| problem | nudge | seeds | asks per trial, median (range) | CPU s, median (range) | asking s, median "
          "| trials to within 1% of final, median (range) | final best µs, median (range) |")
    print("|---|---|---|---|---|---|---|---|")
    for label in dict.fromkeys(r["problem"] for r in rows):
        for nudge in dict.fromkeys(r["nudge"] for r in rows):
            rs = [r for r in rows if r["problem"] == label and r["nudge"] == nudge]
            def med(k: str, f: str = ".2f") -> str:
                xs = [r[k] for r in rs if r[k] is not None]
                return f"{statistics.median(xs):{f}} ({min(xs):{f}}-{max(xs):{f}})"
            print(f"| {label} | {nudge or 'off'} | {len(rs)} | {med('asks_per_trial')} | {med('cpu_s', '.1f')} | "
                  f"{statistics.median(r['asking_s'] for r in rs):.1f} | {med('reach', 'g')} | {med('final_us', '.2f')} |")
    print("\nper seed (final best µs off -> on; trials to within 1% off -> on):")
    for label in dict.fromkeys(r["problem"] for r in rows):
        by = {(r["seed"], r["nudge"]): r for r in rows if r["problem"] == label}
        for seed in sorted({s for s, _ in by}):
            pair = [by[k] for k in sorted(by) if k[0] == seed]
            print(f"  {label} seed {seed}: " + "; ".join(f"nudge {r['nudge']}: {r['final_us']:.2f} µs at {r['reach']}, "
                                                          f"{r['asks_per_trial']:.2f} asks/trial" for r in pair))


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=8, help="seeds 0 .. N-1")
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--nudge", type=int, default=4, help="IDLE_NUDGE measured against 0")
    ap.add_argument("--problem", type=int, action="append", help="index into PROBLEMS (default: all)")
    ap.add_argument("--out", help="JSON of the runs: read, extended with missing ones, written back")
    args = ap.parse_args(argv)
    rows: list[dict] = json.load(open(args.out)) if args.out and os.path.exists(args.out) else []
    done = {(r["problem"], r["seed"], r["nudge"]) for r in rows}
    chosen = [PROBLEMS[i] for i in args.problem] if args.problem else list(PROBLEMS)
    with tempfile.TemporaryDirectory(prefix="tuner-nudge-rec-") as tmp:
        url = recording(tmp)
        truth = true_us(url)
        for seed in range(args.seeds):
            for label, template, problem, fields in chosen:
                for nudge in (0, args.nudge):
                    if (label, seed, nudge) in done:
                        continue
                    rows.append(one(url, truth, label, template, problem, fields, seed, args.trials, nudge))
                    r = rows[-1]
                    print(f"{label} seed {seed} nudge {nudge}: {r['asks_per_trial']:.2f} asks/trial, {r['cpu_s']:.1f} "
                          f"CPU s, final {r['final_us']:.2f} µs at {r['reach']}", file=sys.stderr, flush=True)
                    if args.out:
                        json.dump(rows, open(args.out, "w"))
    table([r for r in rows if r["problem"] in {c[0] for c in chosen}])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
