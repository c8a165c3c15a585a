"""Makespan of packed persistent deals, simulated on the CPU (no GPU): the items of a packed problem, their cost
its key tiles + FILL (an item's exposed prologue and epilogue, in tiles), dealt to SMS CTAs, against the ideal
(the total over the CTAs, or the largest item). Orders (attn_fwd_wgmma/packed_order.h builds "levels"):

  levels   the real items, levels descending (causal: query tile v of every sequence longer than v; non-causal:
           every query tile of the sequences of exactly v + 1 query tiles), dealt in a snake;
  m-major  causal's levels for non-causal too (query tile v of every sequence longer than v), snaked;
  units    the earlier persistent deal: (q, blocks - 1 - q) unit pairs of each sequence (non-causal: single
           tiles), as many units as the longest sequence has, empties included, strided over the grid.

    python benchmarks/packed_schedule_sim.py                       # the problems below
    python benchmarks/packed_schedule_sim.py --shape 16,4096 --lengths uniform:64 --heads 32
"""

from __future__ import annotations

import argparse

from tuner.problem import Problem

FILL = 0.3
SMS = 132
BM = 128
PROBLEMS = [(16, 4096, "uniform:64"), (8, 8192, "uniform:8192"), (64, 2048, "uniform:16"), (4, 16384, "uniform:1024"),
            (23, 3000, "uniform:63"), (100, 1024, "uniform:1")]


def level_items(tiles: list[int], heads: int, causal: bool, by_length: bool) -> list[float]:
    """Item costs in deal order: levels descending; by_length (non-causal): level v holds the sequences of
    exactly v + 1 query tiles, else query tile v of every sequence longer than v."""
    out: list[float] = []
    for v in range(max(tiles) - 1, -1, -1):
        for t in tiles:
            if by_length:
                out += [t + FILL] * (heads * t) if t == v + 1 else []
            elif t > v:
                out += [(v + 1 if causal else t) + FILL] * heads
    return out


def snake_makespan(costs: list[float], sms: int) -> float:
    load = [0.0] * sms
    for i, c in enumerate(costs):
        r, x = divmod(i, sms)
        load[x if r % 2 == 0 else sms - 1 - x] += c
    return max(load)


def units_makespan(tiles: list[int], heads: int, causal: bool, sms: int) -> float:
    """The earlier deal: unit u to CTA u % sms, the longest sequence's units per (sequence, head); a causal unit q
    of a sequence of t tiles is its tiles (t - 1 - q, q), empty from q = ceil(t / 2) (tile_scheduler.h before)."""
    top = max(tiles)
    per_head = (top + 1) // 2 if causal else top
    load = [0.0] * sms
    u = 0
    for t in tiles:
        for _ in range(heads):
            for q in range(per_head):
                pair = dict.fromkeys((t - 1 - q, q) if causal else (q,))  # the sequence's own pair
                load[u % sms] += sum((m + 1 if causal else t) + FILL for m in pair if 0 <= m < t and q < t)
                u += 1
    return max(load)


def report(batch: int, seq: int, lengths: str, heads: int, sms: int) -> None:
    lens = Problem(batch, heads, seq, seq, 128, "bf16", causal=True, layout="packed", lengths=lengths).key_lengths()
    tiles = [(n + BM - 1) // BM for n in lens]
    for causal in (True, False):
        levels = level_items(tiles, heads, causal, by_length=not causal)
        ideal = max(sum(levels) / sms, max(levels))
        m_major = level_items(tiles, heads, causal, by_length=False)
        print(f"B{batch} S{seq} {lengths} {'causal' if causal else 'non-causal'}: ideal {ideal:.0f} tiles, "
              f"levels {snake_makespan(levels, sms) / ideal:.3f}, m-major {snake_makespan(m_major, sms) / ideal:.3f}, "
              f"units {units_makespan(tiles, heads, causal, sms) / ideal:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", help="B,S (the longest sequence); default: the problems listed in this script")
    ap.add_argument("--lengths", default="uniform:64")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--sms", type=int, default=SMS)
    args = ap.parse_args()
    problems = [(*map(int, args.shape.split(",")), args.lengths)] if args.shape else PROBLEMS
    for batch, seq, lengths in problems:
        report(batch, seq, lengths, args.heads, args.sms)


if __name__ == "__main__":
    main()
