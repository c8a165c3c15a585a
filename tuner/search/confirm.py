"""The confirm stage: the search's best variants re-timed interleaved with the baselines, to pick the real winner.

In-search timings of a ~0.5 ms kernel drift by ±5%, more than the gap between
the top variants. So after a study's trials, its K best distinct variants are
timed again, in R rounds that alternate them with every SDPA baseline (the
start of each round rotates); each variant's figure is the median over the
rounds of its per-round ratio to the fastest baseline, and the winner is the
best figure. Clearly slower variants and baselines stop early
(runtime.timing.confirm_pruner), so the rounds go to the close race. With
several cards the rounds are shared by those that end the study together
(tuner.search.confirm_ledger), each round timed on one card. The rounds are
stored with the winner.

The figure compared is the search's objective (tuner.runtime.objective): µs back
to back, J per call (per-round ratios of joules), or µs of isolated calls. Every
round records µs; energy is read in every round under --objective energy, else by
an energy pass after the race (energy_pass): one 0.5 s metered block for the
winner and one for its baseline, the J per call the store and the report keep,
stored with the last round.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
import uuid
from typing import Callable, Optional

from tuner.backends.base import ConfirmTimings
from tuner.errors import TunerError
from tuner.kernels.manifest import load_manifest
from tuner.kernels.variant import Variant
from tuner.problem import Problem
from tuner.runtime.baselines import confirm_stage_pruner
from tuner.runtime.energy import Energy
from tuner.runtime.objective import ENERGY, ISOLATED, TIME, figure
from tuner.runtime.timing import CONFIRM_AFTER, per_round_ratio
from tuner.search.confirm_ledger import Attributes, Ledger, MemoryAttributes, Plan, await_plan, finish, publish
from tuner.search.job import Context
from tuner.search.liveness import WORKER_ID
from tuner.status import TrialStatus
from tuner.store import ConfirmRecord, TrialFilter, TrialRow

DEFAULT_CONFIRM = 5  # variants re-timed
DEFAULT_ROUNDS = 7
ROUND_FIGURE = {TIME: "us", ENERGY: "j", ISOLATED: "iso"}  # the ledger's figure each objective compares


def candidates(ctx: Context, problem: Problem, template: str, k: int) -> list[TrialRow]:
    """The k best distinct variants (by the objective's figure) of the problem measured on this card with
    this template code (a replay's: answered from its recording, as its search reuses). With energy or
    isolated µs the fastest back to back joins them: it is what `results --best` shows first, and a confirm
    stage that did not race it would read as stale there."""
    manifest = load_manifest(template)
    rows = ctx.store.query_trials(TrialFilter(problem=problem, template=template, status=TrialStatus.OK))
    rows = [r for r in rows if r.gpu_name == ctx.gpu_name and r.template_hash == manifest.source_hash
            and r.median_us is not None and r.replayed_from == ctx.replayed_from]
    ranked = sorted((r for r in rows if figure(ctx.objective, r) is not None),
                    key=lambda r: (figure(ctx.objective, r), r.id))
    chosen: dict[str, TrialRow] = {}
    for row in ranked:
        chosen.setdefault(row.variant_name, row)
        if len(chosen) == k:
            break
    fastest = min(rows, key=lambda r: (r.median_us, r.id), default=None)
    if ctx.objective != TIME and chosen and fastest is not None:
        chosen.setdefault(fastest.variant_name, fastest)
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


def stopped_early(rounds: list[dict[str, float]], variants: list[str]) -> set[str]:
    """The implementations the confirm stage stops timing, judged on the pooled rounds finished so far
    (runtime.baselines.confirm_stage_pruner): after one round the clearly slower baselines, after three
    the clearly slower variants."""
    if not rounds:
        return set()
    prune = confirm_stage_pruner(variants, rounds[0])
    dropped = set(prune(0, {impl: [us] for impl, us in rounds[0].items()}))
    first = rounds[:CONFIRM_AFTER]
    if len(first) == CONFIRM_AFTER:
        common = [impl for impl in first[0] if impl not in dropped and all(impl in r for r in first)]
        dropped |= set(prune(CONFIRM_AFTER - 1, {impl: [r[impl] for r in first] for impl in common}))
    return dropped


def pooled_timings(rounds: list[dict[str, float]]) -> ConfirmTimings:
    """Each implementation's µs over the pooled rounds it ran (those timed in every round align)."""
    times: dict[str, list[float]] = {}
    for timed in rounds:
        for impl, us in timed.items():
            times.setdefault(impl, []).append(us)
    return ConfirmTimings({impl: tuple(us) for impl, us in times.items()})


def in_every_round(rounds: list[dict[str, float]]) -> ConfirmTimings:
    """The implementations timed in every pooled round (the only ones that may win: their per-round
    lists align round by round, whichever card timed a round and whatever others skipped)."""
    return ConfirmTimings({impl: times for impl, times in pooled_timings(rounds).rounds.items()
                           if len(times) == len(rounds)})


def comparable_rounds(timed: list[dict[str, float]], figure: list[dict[str, float]]) -> list[dict[str, float]]:
    """The rounds of an objective's `figure` that read it for every implementation the round timed (`timed`, its
    µs): a round missing one reading (no energy counter step seen) is left out, not the implementation, which
    would lose the race to a weaker baseline; every round when none is complete (the figure was never read)."""
    complete = [f for t, f in zip(timed, figure) if set(f) == set(t)]
    return complete or figure


def take_rounds(ctx: Context, ledger: Ledger, problem: Problem, variants: list[Variant], extra: int = 0) -> None:
    """Time rounds of the ledger's plan on this worker's card, one at a time, until all are started (or,
    with `extra`, that many more); a round the card fails is given back before the error goes on."""
    needs = getattr(ctx.backend, "needs_compile", True)
    builts = [ctx.hooks.build(v, ctx.profile.nvcc_arch) if needs else None for v in variants]
    names = [v.name for v in variants]
    left = extra
    while not ctx.stop.is_set():
        number = ledger.begin_round(extra=left > 0)
        if number is None:
            return
        try:
            leading = ledger.leading_rounds(ROUND_FIGURE[ctx.objective])
            dropped = stopped_early(leading, names)
            keep = [i for i, name in enumerate(names) if name not in dropped]
            # The baselines round 0 timed (its µs: a baseline without an energy reading there is still one).
            timed = leading if ctx.objective == TIME else ledger.leading_rounds(ROUND_FIGURE[TIME])
            baselines = None if not timed else [b for b in timed[0] if b not in names and b not in dropped]
            timings = ctx.backend.confirm(problem, [variants[i] for i in keep], [builts[i] for i in keep], 1,
                                          baselines=baselines, first_round=number)
        except BaseException:
            ledger.release()
            raise
        ledger.record(number, {impl: times[0] for impl, times in timings.rounds.items() if times},
                      **round_figures(timings))
        if extra:
            left -= 1
            if left == 0:
                return


def round_figures(timings: ConfirmTimings) -> dict[str, dict[str, float]]:
    """The ledger's figures (confirm_ledger.FIGURES) of a one-round ConfirmTimings, besides its µs."""
    energy = {impl: e[0] for impl, e in timings.energy.items() if e and e[0] is not None}
    return {"j": {impl: e.joules_per_call for impl, e in energy.items()},
            "w": {impl: e.power_w for impl, e in energy.items()},
            "mhz": {impl: e.sm_mhz for impl, e in energy.items() if e.sm_mhz is not None},
            "iso": {impl: i[0] for impl, i in timings.isolated_us.items() if i and i[0] is not None}}


def pooled_figures(pooled: dict[str, list[dict[str, float]]]
                   ) -> tuple[dict[str, tuple[Optional[Energy], ...]], dict[str, tuple[Optional[float], ...]]]:
    """Each implementation's Energy and isolated µs over the pooled rounds it ran (Ledger.pooled; aligned
    with pooled_timings: None in a round where it was not measured)."""
    us, joules, watts, mhz, iso = (pooled[key] for key in ("us", "j", "w", "mhz", "iso"))
    energy: dict[str, list[Optional[Energy]]] = {}
    isolated: dict[str, list[Optional[float]]] = {}
    for r, timed in enumerate(us):
        for impl in timed:
            j, w = joules[r].get(impl), watts[r].get(impl)
            energy.setdefault(impl, []).append(None if j is None or w is None else Energy(j, w, mhz[r].get(impl)))
            isolated.setdefault(impl, []).append(iso[r].get(impl))
    return ({impl: tuple(e) for impl, e in energy.items()},
            {impl: tuple(i) for impl, i in isolated.items() if any(x is not None for x in i)})


def energy_pass(ctx: Context, problem: Problem, winner: Variant, baseline: Optional[str], rounds: int,
                energy: dict[str, tuple[Optional[Energy], ...]]) -> dict[str, tuple[Optional[Energy], ...]]:
    """`energy` with the J per call of the winner and its baseline (None: no baseline) in their last round: one
    metered block each (objective.ENERGY_PASS), timed on this worker's card after the race. A pass the backend
    fails leaves `energy` as it was: the confirmation stands without J per call."""
    needs = getattr(ctx.backend, "needs_compile", True)
    built = ctx.hooks.build(winner, ctx.profile.nvcc_arch) if needs else None
    try:
        timed = ctx.backend.confirm(problem, [winner], [built], 1, baselines=[baseline] if baseline else [],
                                    first_round=rounds, energy_pass=True)
    except TunerError:
        return energy
    found = dict(energy)
    for impl, readings in timed.energy.items():
        if readings and readings[0] is not None and impl in found:
            found[impl] = (*found[impl][:rounds - 1], readings[0])
    return found


def participant(ctx: Context) -> str:
    """This worker's name in a ledger (a process and its run)."""
    return f"{WORKER_ID}:{ctx.run_id}"


def confirm_problem(ctx: Context, problem: Problem, template: str, k: int, rounds: int,
                    say: Callable[[str], None], attrs: Optional[Attributes] = None) -> Optional[int]:
    """Run the confirm stage of one problem on the worker's backend, its rounds shared (through `attrs`,
    a study's attributes) with the workers that join; returns the stored confirmation's id."""
    start = time.perf_counter()
    attrs = attrs if attrs is not None else MemoryAttributes()
    rows = candidates(ctx, problem, template, k)
    variants = [Variant.from_stored(r.template, r.params) for r in rows]
    plan = Plan(id=uuid.uuid4().hex[:12], gpu=ctx.gpu_name, template=template,
                variants=tuple((v.name, r.params) for v, r in zip(variants, rows)), rounds=rounds, created=time.time())
    publish(attrs, plan if rows else dataclasses.replace(plan, done=True))  # waiting helpers learn either way
    if not rows:
        say(f"nothing to confirm: no ok trial of the current {template} code measured on {ctx.gpu_name}")
        return None
    ledger = Ledger(attrs, plan, participant(ctx))
    try:
        take_rounds(ctx, ledger, problem, variants)
        ledger.wait_settled(ctx.stop)
        missing = ledger.missing()
        if missing and not ctx.stop.is_set():  # a participant vanished mid-round: time them here
            take_rounds(ctx, ledger, problem, variants, extra=missing)
    finally:
        finish(attrs, plan)
    figures = ledger.pooled()  # every figure of every round, from one read
    pooled = figures["us"]
    if ctx.stop.is_set() and len(pooled) < rounds:  # Ctrl-C: a winner of fewer rounds is not a confirmed one
        ctx.interrupt()
        say(f"confirm stage stopped after {len(pooled)} of {rounds} rounds; nothing confirmed")
        return None
    timings = pooled_timings(pooled)
    complete = in_every_round(comparable_rounds(pooled, figures[ROUND_FIGURE[ctx.objective]]))
    names = [v.name for v in variants]
    winner, ratio, baseline = pick_winner(complete, names, [impl for impl in complete.rounds if impl not in names])
    if winner is None:
        say(f"confirm stage of {problem.label}: no variant could be timed again ({ctx.objective})")
        return None
    by_name = {v.name: r for v, r in zip(variants, rows)}
    energy, isolated = pooled_figures(figures)
    if ctx.objective != ENERGY:  # the race's rounds were not metered: the winner's and its baseline's J now
        energy = energy_pass(ctx, problem, variants[names.index(winner)], baseline, len(pooled), energy)
    joules = [e.joules_per_call for e in energy.get(winner, ()) if e is not None]
    record = ConfirmRecord(
        run_id=ctx.run_id, problem=problem, rounds=len(pooled), winner_trial_id=by_name[winner].id,
        winner_us=statistics.median(timings.rounds[winner]), winner_ratio=ratio, baseline_impl=baseline,
        timings={impl: (by_name[impl].id if impl in by_name else None, times) for impl, times in timings.rounds.items()},
        objective=ctx.objective, winner_joules_per_call=statistics.median(joules) if joules else None,
        energy=energy, isolated_us=isolated,
    )
    confirmation = ctx.store.add_confirmation(record)
    versus = f"{ratio:.3f}x {baseline}" if ratio is not None else "no baseline"
    versus += "" if ctx.objective == TIME else f" in {ctx.objective}"
    timed = [n for n in names if n in timings.rounds]  # the others failed their check on fresh inputs
    raced = sum(len(timings.rounds[n]) == len(timings.rounds[winner]) for n in timed)
    cards = ledger.participants()
    where = f" on {cards} cards" if cards > 1 else ""
    say(f"confirmed {winner}: {versus}, median of {len(pooled)} interleaved rounds{where} over {len(timed)} variants "
        f"({raced} timed in every round, the others stopped early as clearly slower; "
        f"{time.perf_counter() - start:.1f} s)")
    return confirmation


def help_confirm(ctx: Context, attrs: Attributes, problem: Problem, since: float, wait_s: float) -> bool:
    """Join the confirm stage another worker runs for `problem` (its plan published at or after `since`,
    waited for at most `wait_s`) and time rounds of it on this card; False when there was none to join."""
    plan = await_plan(attrs, since, ctx.stop, wait_s)
    if plan is None or plan.gpu != ctx.gpu_name:
        return False
    variants = [Variant.from_stored(plan.template, params) for _, params in plan.variants]
    take_rounds(ctx, Ledger(attrs, plan, participant(ctx)), problem, variants)
    return True
