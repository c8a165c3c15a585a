"""Early stop over many seeds, simulated on full replayed searches (issue 38, item 3; NOTES, session 21).

What it measures: for each recorded problem and seed, one full replayed search (tpe by default, --trials
budget, default search settings, no warm start, no early stop) through the real `run_search` (replay
backend). From that study's budgeted trials, in order, it takes the figures the search itself saw (the
drawn recorded timing; None for a trial without one) and each trial's variant. A seeded replay is
deterministic, so a search with `--early-stop N` is a prefix of the full one: for each N the rule
(tuner.search.early_stop.plateaued, on the seen figures) gives the budgeted trial after which the loop stops
asking; the trials already asked then (`--lag`, measured with the real option: see --measure) still run.
It prints, per N, the trials the early-stopped search uses and whether its final best (the true recorded
time, median of the recorded timings, of the variant with the best seen figure in that prefix) is within
1% of the full budget's final best for the same seed.

--measure SEED:N runs the real `--early-stop N` search too and compares its trial count and final variant
with the simulation (the check that the simulation matches).

    python benchmarks/early_stop/simulate.py --from sqlite:////tmp/h100.db --seeds 24 --cache /tmp/h100.json
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
from collections import Counter
from dataclasses import dataclass
from typing import Optional, Sequence

import optuna
from rich.console import Console

from tuner.backends.replay import REPLAYED_STATUSES, recorded_measurements
from tuner.search.early_stop import budgeted_values, plateaued
from tuner.search.options import SearchOptions
from tuner.search.run import run_search
from tuner.search.study import ATTR_VARIANT, counts_toward_budget, opened_storage
from tuner.status import TrialStatus
from tuner.store import TrialFilter, open_store

WITHIN_PCT = 1.0  # a stopped search "keeps the winner" when its final best is within this of the full one's


@dataclass(frozen=True)
class Problem:
    """One recorded problem: what a replayed search needs, and each variant's true time (µs)."""

    label: str
    options: dict[str, object]  # SearchOptions fields that name the problem
    true_us: dict[str, float]
    best_us: float


@dataclass(frozen=True)
class Seen:
    """One full replayed search: per budgeted trial, the figure the search saw and its variant."""

    values: list[Optional[float]]
    variants: list[Optional[str]]


def load_problems(url: str, only: Sequence[str] = ()) -> list[Problem]:
    """Every problem of the recording with a replayable ok variant (or those whose label is in `only`)."""
    with open_store(url, create=False) as store:
        rows = [r for r in store.query_trials(TrialFilter()) if r.status in REPLAYED_STATUSES]
    out: list[Problem] = []
    for (problem, gpu), _ in Counter((r.problem, r.gpu_name) for r in rows).most_common():
        if only and problem.label not in only:
            continue
        chosen = [r for r in rows if r.problem == problem and r.gpu_name == gpu]
        true_us = {rs[0].variant_name: statistics.median(r.median_us for r in ok)
                   for rs in recorded_measurements(chosen).values()
                   if (ok := [r for r in rs if r.status is TrialStatus.OK and r.median_us is not None])}
        if not true_us:
            continue
        p = problem
        options: dict[str, object] = dict(
            gpu=chosen[0].profile, shapes=(f"{p.batch},{p.heads},{p.seq_q},{p.seq_k},{p.head_dim}",),
            heads_kv=p.heads_kv, dtype=p.dtype, causal=p.causal, layout=p.layout, lengths=p.lengths,
            window=(p.window_left, p.window_right), softcap=p.softcap, template=chosen[0].template)
        out.append(Problem(p.label, options, true_us, min(true_us.values())))
    return out


def replay(url: str, problem: Problem, seed: int, trials: int, sampler: str,
           early_stop: Optional[int] = None) -> Seen:
    """The real search (replay backend) into a throw-away store; its budgeted trials in order."""
    with tempfile.TemporaryDirectory(prefix="tuner-early-stop-") as tmp:
        db_url = f"sqlite:///{os.path.join(tmp, 'results.db')}"
        options = SearchOptions(**problem.options, trials=trials, sampler=sampler, seed=seed,  # type: ignore[arg-type]
                                db_url=db_url, backend="replay", replay_from=url, warm_start=0,
                                early_stop=early_stop)
        report = run_search(options, console=Console(file=io.StringIO()))
        with opened_storage(db_url, create=False) as storage:
            study = optuna.load_study(study_name=report.studies[0], storage=storage)
            budgeted = sorted((t for t in study.get_trials(deepcopy=False) if counts_toward_budget(t)),
                              key=lambda t: t.number)
            return Seen(budgeted_values(study), [t.user_attrs.get(ATTR_VARIANT) for t in budgeted])


def stop_at(values: Sequence[Optional[float]], patience: int) -> int:
    """Budgeted trials held when the rule fires (the loop checks before each ask); len(values) if never."""
    for k in range(1, len(values) + 1):
        if plateaued(values[:k], patience):
            return k
    return len(values)


def final_true(problem: Problem, seen: Seen, used: int) -> Optional[float]:
    """True µs of the in-search best (the lowest seen figure; first on a tie) among the first `used` trials."""
    best: Optional[tuple[float, int]] = None
    for i, value in enumerate(seen.values[:used]):
        if value is not None and (best is None or value < best[0]):
            best = (value, i)
    if best is None:
        return None
    name = seen.variants[best[1]]
    return problem.true_us.get(name, best[0]) if name else best[0]


def summarise(problem: Problem, runs: dict[int, Seen], patiences: Sequence[int], lag: int) -> list[dict[str, object]]:
    """Per N: trials used and how far each seed's final best is from its full search's."""
    out: list[dict[str, object]] = []
    for n in patiences:
        used, gaps = [], []
        for seed, seen in sorted(runs.items()):
            k = min(len(seen.values), stop_at(seen.values, n) + lag)
            full, stopped = final_true(problem, seen, len(seen.values)), final_true(problem, seen, k)
            used.append(k)
            gaps.append(None if full is None or stopped is None else (stopped / full - 1) * 100)
        within = sum(1 for g in gaps if g is not None and g <= WITHIN_PCT)
        out.append(dict(problem=problem.label, N=n, seeds=len(runs), used_median=statistics.median(used),
                        used_min=min(used), used_max=max(used),
                        full_median=statistics.median(len(s.values) for s in runs.values()),
                        within=within, worst_gap_pct=max((g for g in gaps if g is not None), default=None),
                        gaps_pct=gaps, used=used))
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--from", dest="url", required=True, help="recording (results-store URL)")
    ap.add_argument("--problem", action="append", default=[], help="problem label (default: every recorded one)")
    ap.add_argument("--seeds", type=int, default=20, help="seeds 0 .. N-1")
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--sampler", default="tpe")
    ap.add_argument("--patience", default="10,15,20,30", help="the N of --early-stop to simulate")
    ap.add_argument("--lag", type=int, default=0, help="trials still run after the rule fires (see --measure)")
    ap.add_argument("--cache", help="JSON of the full runs: read, extended with missing seeds, written back")
    ap.add_argument("--measure", action="append", default=[], help="SEED:N: run the real --early-stop N too")
    args = ap.parse_args(argv)
    patiences = [int(x) for x in args.patience.split(",")]
    cache: dict[str, dict[str, dict[str, list]]] = {}
    if args.cache and os.path.exists(args.cache):
        with open(args.cache) as f:
            cache = json.load(f)
    rows: list[dict[str, object]] = []
    for problem in load_problems(args.url, args.problem):
        done = cache.setdefault(problem.label, {})
        runs: dict[int, Seen] = {}
        for seed in range(args.seeds):
            if str(seed) not in done:
                start = time.perf_counter()
                seen = replay(args.url, problem, seed, args.trials, args.sampler)
                done[str(seed)] = {"values": seen.values, "variants": seen.variants}
                print(f"{problem.label} seed {seed}: {len(seen.values)} trials, {time.perf_counter() - start:.0f} s",
                      file=sys.stderr, flush=True)
                if args.cache:
                    with open(args.cache, "w") as f:
                        json.dump(cache, f)
            runs[seed] = Seen(done[str(seed)]["values"], done[str(seed)]["variants"])
        for spec in args.measure:
            seed, n = (int(x) for x in spec.split(":"))
            real = replay(args.url, problem, seed, args.trials, args.sampler, early_stop=n)
            seen = runs.get(seed) or Seen(**done[str(seed)])
            k = stop_at(seen.values, n)
            prefix = (real.values == seen.values[:len(real.values)]
                      and real.variants == seen.variants[:len(real.variants)])
            print(f"measure {problem.label} seed {seed} N={n}: real {len(real.values)} trials, rule fires at {k} "
                  f"(lag {len(real.values) - k}); prefix of the full run: {prefix}; final true µs real "
                  f"{final_true(problem, real, len(real.values))} vs simulated "
                  f"{final_true(problem, seen, min(len(seen.values), k + args.lag))}", flush=True)
        rows += summarise(problem, runs, patiences, args.lag)
    print("| problem | N | seeds | trials used, median (range) | full run's trials (median) "
          "| seeds within 1% of full | worst gap |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        worst = "-" if r["worst_gap_pct"] is None else f"{r['worst_gap_pct']:+.2f}%"
        print(f"| {r['problem']} | {r['N']} | {r['seeds']} | {r['used_median']:g} ({r['used_min']}-{r['used_max']}) | "
              f"{r['full_median']:g} | {r['within']}/{r['seeds']} | {worst} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
