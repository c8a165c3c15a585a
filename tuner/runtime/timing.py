"""Timing discipline: warm-up, L2 flush between repetitions, CUDA events, median and spread."""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any, Callable, Collection, Mapping, Optional, Sequence

from tuner.runtime.energy import EnergyMeter
from tuner.runtime.timed import Timing

METERED_MAX_REPS = 100_000  # a metered block's repetitions may go past max_reps to fill the energy window


def _quantile(sorted_values: list[float], q: float) -> float:
    if len(sorted_values) == 1:
        return sorted_values[0]
    return statistics.quantiles(sorted_values, n=100, method="inclusive")[int(q * 100) - 1]


_clean_buffers: dict[tuple[int, int], Any] = {}  # (device, L2 bytes) -> a buffer only ever read


def _l2_flush(l2_bytes: int) -> Callable[[], Any]:
    """Evict the L2 by reading twice its size of data that is never written: the L2 is then full of clean
    lines. (A memset leaves it full of dirty lines, which the timed kernel must write back: on an H100 that
    added ~10 us to every kernel, ~10% of a memory-bound decode step.)"""
    import torch

    key = (torch.cuda.current_device(), l2_bytes)
    buf = _clean_buffers.get(key)
    if buf is None:
        buf = _clean_buffers[key] = torch.ones(2 * l2_bytes // 4, dtype=torch.int32, device="cuda")
    return buf.sum


def time_cuda(fn: Callable[[], Any], *, l2_bytes: int = 64 << 20, warmup_ms: float = 25.0,
              rep_ms: float = 100.0, min_reps: int = 10, max_reps: int = 1000,
              meter: Optional[EnergyMeter] = None, isolated: bool = False) -> Timing:
    """Median time of `fn` on the current stream, L2 flushed before each repetition.

    Each repetition is bracketed by its own pair of events, so the flush
    (a read of twice the L2 size, see _l2_flush) is not counted. Back to back (the default) the
    repetitions follow each other with no host wait, the card at its power limit, as in a model's
    forward pass; `meter` then brackets them (the device synchronized before its start and before its
    end; at least meter.min_window_s of them, as NVML's energy counter moves in ~100 ms steps) and the
    Timing carries their Energy. `isolated`: each repetition is flush, host synchronize,
    then the timed call and a synchronize, so the card idles between calls (and keeps its boost clock):
    the latency of a call made now and then.
    """
    import torch

    flush = _l2_flush(l2_bytes)
    fn()
    torch.cuda.synchronize()
    # Estimate one call to size the warm-up and the repetition count.
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        fn()
    end.record()
    torch.cuda.synchronize()
    est_ms = max(start.elapsed_time(end) / 3, 1e-3)
    for _ in range(max(1, int(warmup_ms / est_ms))):
        fn()
    # A repetition is the L2 flush and the call: the count is sized by both, so that the repetitions take
    # about rep_ms whatever the kernel (sized by the call alone, a 40 µs decode kernel's 1000 repetitions
    # took ~0.2 s, its flushes and launches the most of it, a trial 0.25 s on an H200).
    start.record()
    for _ in range(3):
        flush()
        fn()
    end.record()
    torch.cuda.synchronize()
    rep_est_ms = max(start.elapsed_time(end) / 3, est_ms)
    reps = max(min_reps, min(max_reps, int(rep_ms / rep_est_ms)))
    metered = meter is not None and not isolated and meter.available
    if metered:  # NVML's energy counter steps about every 100 ms: the window must hold several steps
        reps = max(reps, min(METERED_MAX_REPS, math.ceil(meter.min_window_s * 1000.0 / rep_est_ms)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    if metered:
        torch.cuda.synchronize()
        meter.start()
    for i in range(reps):
        flush()
        if isolated:
            torch.cuda.synchronize()
        starts[i].record()
        fn()
        ends[i].record()
        if isolated:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    if metered:
        meter.end()  # before the host reads the events: the window holds the repetitions alone
    times = sorted(s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends))
    median = statistics.median(times)
    energy = meter.stop(reps, median) if metered else None
    return Timing(median, _quantile(times, 0.2), _quantile(times, 0.8), reps, energy)


def time_call(fn: Callable[[], Any], *, meter: Optional[EnergyMeter] = None, isolated_too: bool = False,
              **kwargs: Any) -> Timing:
    """time_cuda back to back, its energy read by `meter`; with `isolated_too`, the median of isolated
    calls too (a second time_cuda, isolated=True), for --objective isolated."""
    timing = time_cuda(fn, meter=meter, **kwargs)
    if not isolated_too:
        return timing
    return dataclasses.replace(timing, isolated_us=time_cuda(fn, isolated=True, **kwargs).median_us)


Pruner = Callable[[int, Mapping[str, Sequence[float]]], Collection[str]]


def interleaved_rounds(calls: Mapping[str, Callable[[], Timing]], rounds: int,
                       on_round: Callable[[int], None] = lambda r: None,
                       prune: Optional[Pruner] = None, first_round: int = 0) -> dict[str, list[float]]:
    """Each call's median µs in each of `rounds` rounds (interleaved_timings, its µs)."""
    timed = interleaved_timings(calls, rounds, on_round, prune, first_round)
    return {name: [t.median_us for t in timings] for name, timings in timed.items()}


def interleaved_timings(calls: Mapping[str, Callable[[], Timing]], rounds: int,
                        on_round: Callable[[int], None] = lambda r: None,
                        prune: Optional[Pruner] = None, first_round: int = 0) -> dict[str, list[Timing]]:
    """Each call's Timing in each of `rounds` rounds, every call once a round; the first call of a
    round rotates, so none always runs first (or on a cooler card). Compare with per-round ratios.
    `first_round`: the number of the first round (rounds of one race timed a few at a time go on rotating).

    `prune(r, times)`, after round r (0-based) with the µs of the calls still running, names calls
    to stop timing: theirs keep the rounds they ran, aligned with everyone's first rounds."""
    order, timed = list(calls), {name: [] for name in calls}
    for r in range(rounds if order else 0):
        on_round(r)
        turn = (first_round + r) % len(order)
        for name in order[turn:] + order[:turn]:
            timed[name].append(calls[name]())
        if prune is not None and r + 1 < rounds:
            dropped = set(prune(r, {name: [t.median_us for t in timed[name]] for name in order}))
            order = [name for name in order if name not in dropped]
            if not order:
                break
    return timed


def per_round_ratio(baseline_us: Sequence[float], variant_us: Sequence[float]) -> float:
    """Median over the rounds both ran of baseline µs / variant µs (> 1: the variant is faster): each
    round's ratio cancels the drift the card had in that round."""
    return statistics.median(b / t for b, t in zip(baseline_us, variant_us))


CONFIRM_AFTER = 3  # rounds after which the confirm stage stops the clearly slower variants


def confirm_pruner(variants: Collection[str], baselines: Collection[str], *, after: int = CONFIRM_AFTER,
                   margin: float = 0.02, baseline_margin: float = 0.10,
                   keep_fastest_of: Collection[str] = ()) -> Pruner:
    """Successive elimination for the confirm stage, so its rounds go to the variants still in the race:
    after round 1 a baseline slower than the fastest by more than `baseline_margin` stops (it cannot be
    the one the winner's ratio is taken against), except the fastest of `keep_fastest_of` (the SDPA
    backends: an export's routing compares with the fastest of them); after `after` rounds a variant
    whose median per-round ratio is more than `margin` below the leader's stops (2% is about twice the
    spread of a median of three per-round ratios on an H100). With no baseline, variants compare by
    median µs."""
    def prune(r: int, times: Mapping[str, Sequence[float]]) -> set[str]:
        base = [b for b in baselines if b in times]
        drop: set[str] = set()
        if r == 0 and base:
            fastest = min(times[b][0] for b in base)
            drop |= {b for b in base if times[b][0] > fastest * (1 + baseline_margin)}
            group = [b for b in base if b in keep_fastest_of]
            if group:
                drop.discard(min(group, key=lambda b: times[b][0]))
        if r + 1 == after:
            racing = [v for v in variants if v in times]
            kept = [b for b in base if b not in drop]
            if kept:
                ref = times[min(kept, key=lambda b: statistics.median(times[b]))]
                score = {v: per_round_ratio(ref, times[v]) for v in racing}
            else:  # higher is better: inverse median time
                score = {v: 1.0 / statistics.median(times[v]) for v in racing}
            if score:
                best = max(score.values())
                drop |= {v for v, x in score.items() if x < best * (1 - margin)}
        return drop
    return prune
