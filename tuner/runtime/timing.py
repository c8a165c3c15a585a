"""Timing discipline: warm-up, L2 flush between repetitions, CUDA events, median and spread."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable, Mapping


@dataclass(frozen=True)
class Timing:
    median_us: float
    p20_us: float
    p80_us: float
    reps: int


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
              rep_ms: float = 100.0, min_reps: int = 10, max_reps: int = 1000) -> Timing:
    """Median time of `fn` on the current stream, L2 flushed before each repetition.

    Each repetition is bracketed by its own pair of events, so the flush
    (a read of twice the L2 size, see _l2_flush) is not counted.
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
    reps = max(min_reps, min(max_reps, int(rep_ms / est_ms)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        flush()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends))
    return Timing(statistics.median(times), _quantile(times, 0.2), _quantile(times, 0.8), reps)


def interleaved_rounds(calls: Mapping[str, Callable[[], Timing]], rounds: int,
                       on_round: Callable[[int], None] = lambda r: None) -> dict[str, list[float]]:
    """Each call's median µs in each of `rounds` rounds, every call once a round; the first call of a
    round rotates, so none always runs first (or on a cooler card). Compare with per-round ratios."""
    order, times = list(calls), {name: [] for name in calls}
    for r in range(rounds if order else 0):
        on_round(r)
        for name in order[r % len(order):] + order[:r % len(order)]:
            times[name].append(calls[name]().median_us)
    return times
