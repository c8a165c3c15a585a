// Packed sequences on a persistent grid (C::PACKED && C::PERSISTENT): which real work item is a CTA's r-th.
//
// The items, heaviest first, in levels v = top - 1 .. 0 (top: the longest sequence's query tiles):
//   causal: level v holds query tile v of every sequence with more than v query tiles; each costs v + 1 key
//     tiles (where Sq = Sk), so the levels descending are longest-first;
//   non-causal: level v holds every query tile of the sequences of exactly v + 1 query tiles; each costs the
//     sequence's key tiles, so again longest-first (causal's order here: 3-16% over the ideal makespan).
// Within a level, sequence by sequence, the heads fastest (non-causal: then the query tiles): concurrent CTAs
// share a sequence's K/V in L2, each K/V head read by h_per_kv of them at once (GQA).
// The deal is a snake over the G CTAs: the CTA x's r-th item is r G + (r even ? x : G - 1 - x). Simulated
// (benchmarks/packed_schedule_sim.py, 132 CTAs, item cost its key tiles + 0.3): within 2% of the ideal makespan
// where the earlier striding of unit pairs was 1.5-63% over; no empty item is enumerated (with empties in the
// order the snake is 8-20% over).
//
// Item i -> (level, sequence, head) without a table: a walk's i only grows, so each caller keeps the level it
// is in, that level's first item and its count. A level's sequences are counted, and its k-th found, with one
// warp ballot per 32 sequences: every lane of a calling warp calls (the producer's loader warps walk whole, and
// one lane of each issues the loads; consumer warps search their last busy item, and take the items from the Q
// loader, item_mail.h).
#pragma once

#include "../common/attn_args.h"

namespace fc {

template <class C>
struct PackedOrder {
  const AttnArgs& a;
  int top;                          // levels top - 1 .. 0: the longest sequence's query tiles
  mutable int level, first, count;  // the walk's level, its first item and its number of items

  // By every thread of the CTA, converged (the packed persistent kernels only: it votes).
  __device__ __forceinline__ PackedOrder(const AttnArgs& args, int m_blocks) : a(args), top(m_blocks) {
    if constexpr (C::PACKED && C::PERSISTENT) top = longest();
    restart();
  }
  // Before the first level: the next find walks down from the top.
  __device__ __forceinline__ void restart() const {
    level = top;
    first = 0;
    count = 0;
  }

  // Sequence b's query tiles (0 past the batch; at most top, as the levels hold them).
  __device__ __forceinline__ int seq_tiles(int b) const {
    if (b >= a.batch) return 0;
    return min(top, (a.cu_q[b + 1] - a.cu_q[b] + C::BM - 1) / C::BM);
  }
  __device__ __forceinline__ bool in_level(int b, int v) const {
    const int t = seq_tiles(b);
    return C::CAUSAL ? t > v : t == v + 1;
  }
  __device__ __forceinline__ int items_per_seq(int v) const { return C::CAUSAL ? a.heads : a.heads * (v + 1); }
  __device__ __forceinline__ static int lane() { return threadIdx.x % 32; }

  // The longest sequence's query tiles: max_seqlen_q may overstate it, and every level above is walked.
  __device__ __forceinline__ int longest() const {
    int t = 0;
#pragma unroll 1
    for (int c = 0; c < a.batch; c += 32) t = max(t, seq_tiles(c + lane()));
    return __reduce_max_sync(0xffffffffu, t);
  }
  __device__ __forceinline__ int level_items(int v) const {
    int n = 0;
#pragma unroll 1
    for (int c = 0; c < a.batch; c += 32) n += __popc(__ballot_sync(0xffffffffu, in_level(c + lane(), v)));
    return n * items_per_seq(v);
  }
  // Every level's items: each sequence's query tiles, per head.
  __device__ __forceinline__ int total() const {
    int t = 0;
#pragma unroll 1
    for (int c = 0; c < a.batch; c += 32) t += seq_tiles(c + lane());
    return __reduce_add_sync(0xffffffffu, t) * a.heads;
  }
  // The walk at the last level (0), whose items end the order: total() of them in all.
  __device__ __forceinline__ void seek_end(int n_items) const {
    level = 0;
    count = level_items(0);
    first = n_items - count;
  }

  // The k-th (from 0) sequence of level v, which has more than k.
  __device__ __forceinline__ int kth_seq(int v, int k) const {
#pragma unroll 1
    for (int c = 0; c < a.batch; c += 32) {
      const bool in = in_level(c + lane(), v);
      const uint32_t mask = __ballot_sync(0xffffffffu, in);
      const int n = __popc(mask);
      if (k < n) {
        const uint32_t below = (1u << lane()) - 1u;
        return c + __ffs(__ballot_sync(0xffffffffu, in && __popc(mask & below) == k)) - 1;
      }
      k -= n;
    }
    return a.batch - 1;  // not reached: k is below the level's count
  }

  // Item i's sequence b, head h and query tile; false past the last item. The walk moves down level by level
  // from where the previous find left it; an i before that starts it over from the top (a new walk, or
  // last_busy's search stepping back out of the last level).
  __device__ __forceinline__ bool find(int i, int& b, int& h, int& m_block) const {
    if (i < first) restart();
    while (i >= first + count) {
      if (level == 0) return false;
      first += count;
      --level;
      count = level_items(level);
    }
    const int j = i - first, per = items_per_seq(level), k = j / per, rest = j - k * per;
    b = kth_seq(level, k);
    h = rest % a.heads;
    m_block = C::CAUSAL ? level : rest / a.heads;
    return true;
  }
};

}  // namespace fc
