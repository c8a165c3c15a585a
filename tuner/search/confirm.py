"""The confirm stage: the search's best variants re-timed interleaved with the baselines, to pick the real winner.

In-search timings of a ~0.5 ms kernel drift by ±5%, more than the gap between
the top variants. So after a study's trials, its K best distinct variants are
timed again in the same worker, in R rounds that alternate them with every
SDPA baseline (the start of each round rotates); each variant's figure is the
median over the rounds of its per-round ratio to the fastest baseline, and the
winner is the best figure. Clearly slower variants and baselines stop early
(runtime.timing.confirm_pruner), so the rounds go to the close race. The
rounds are stored with the winner.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Optional

from tuner.backends.base import ConfirmTimings
from tuner.kernels.manifest import load_manifest
from tuner.kernels.variant import Variant
from tuner.problem import Problem
from tuner.runtime.timing import per_round_ratio
from tuner.search.job import Context
from tuner.status import TrialStatus
from tuner.store import ConfirmRecord, TrialFilter, TrialRow

DEFAULT_CONFIRM = 5  # variants re-timed
DEFAULT_ROUNDS = 7


def candidates(ctx: Context, problem: Problem, template: str, k: int) -> list[TrialRow]:
    """The k fastest distinct variants of the problem measured on this card with this template code."""
    manifest = load_manifest(template)
    rows = ctx.store.query_trials(TrialFilter(problem=problem, template=template, status=TrialStatus.OK))
    rows = sorted((r for r in rows if r.gpu_name == ctx.gpu_name and r.template_hash == manifest.source_hash
                   and r.median_us is not None), key=lambda r: (r.median_us, r.id))
    chosen: dict[str, TrialRow] = {}
    for row in rows:
        chosen.setdefault(row.variant_name, row)
        if len(chosen) == k:
            break
    return list(chosen.values())


def pick_winner(timings: ConfirmTimings, variants: list[str], baselines: list[str]
                ) -> tuple[Optional[str], Optional[float], Optional[str]]:
    """(winner, its median per-round ratio to the fastest baseline, that baseline); without baselines
    the winner is the fastest median and the ratio is None. Only implementations timed in every round
    compete: the others were stopped early as clearly slower (confirm_pruner)."""
    def finishers(names: list[str]) -> list[str]:
        present = [n for n in names if n in timings.rounds]
        full = max((len(timings.rounds[n]) for n in present), default=0)
        return [n for n in present if len(timings.rounds[n]) == full]

    timed = finishers(variants)
    if not timed:
        return None, None, None
    base = finishers(baselines)
    if not base:
        return min(timed, key=lambda v: statistics.median(timings.rounds[v])), None, None
    fastest = min(base, key=lambda b: statistics.median(timings.rounds[b]))

    def ratio(v: str) -> float:
        return per_round_ratio(timings.rounds[fastest], timings.rounds[v])

    winner = max(timed, key=lambda v: (ratio(v), -statistics.median(timings.rounds[v])))
    return winner, ratio(winner), fastest


def confirm_problem(ctx: Context, problem: Problem, template: str, k: int, rounds: int,
                    say: Callable[[str], None]) -> Optional[int]:
    """Run the confirm stage of one problem on the worker's backend; returns the stored confirmation's id."""
    start = time.perf_counter()
    rows = candidates(ctx, problem, template, k)
    if not rows:
        say(f"nothing to confirm: no ok trial of the current {template} code measured on {ctx.gpu_name}")
        return None
    variants = [Variant.from_stored(r.template, r.params) for r in rows]
    needs = getattr(ctx.backend, "needs_compile", True)
    builts = [ctx.hooks.build(v, ctx.profile.nvcc_arch) if needs else None for v in variants]
    timings = ctx.backend.confirm(problem, variants, builts, rounds)
    names = [v.name for v in variants]
    baselines = [impl for impl in timings.rounds if impl not in names]
    winner, ratio, baseline = pick_winner(timings, names, baselines)
    if winner is None:
        say(f"confirm stage of {problem.label}: no variant could be timed again")
        return None
    by_name = {v.name: r for v, r in zip(variants, rows)}
    record = ConfirmRecord(
        run_id=ctx.run_id, problem=problem, rounds=rounds, winner_trial_id=by_name[winner].id,
        winner_us=statistics.median(timings.rounds[winner]), winner_ratio=ratio, baseline_impl=baseline,
        timings={impl: (by_name[impl].id if impl in by_name else None, times) for impl, times in timings.rounds.items()},
    )
    confirmation = ctx.store.add_confirmation(record)
    versus = f"{ratio:.3f}x {baseline}" if ratio is not None else "no baseline"
    timed = [n for n in names if n in timings.rounds]  # the others failed their check on fresh inputs
    raced = sum(len(timings.rounds[n]) == len(timings.rounds[winner]) for n in timed)
    say(f"confirmed {winner}: {versus}, median of {rounds} interleaved rounds over {len(timed)} variants "
        f"({raced} timed in every round, the others stopped early as clearly slower; "
        f"{time.perf_counter() - start:.1f} s)")
    return confirmation
