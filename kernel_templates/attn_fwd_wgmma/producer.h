// The producer warpgroup: TMA loads of every work item's K/V tiles into the
// STAGES-deep ring and of each consumer's Q rows. Every copy completes on a
// full mbarrier; consumers hand slots (and their Q rows) back through the
// empty ones.
#pragma once

#include <stdint.h>

#include "../common/attn_args.h"
#include "config.h"
#include "item_mail.h"
#include "../common/ptx_sm90.h"
#include "tile_scheduler.h"

namespace fc {

// `ring` counts the K/V tiles loaded so far (slot ring % STAGES, phase
// (ring / STAGES) & 1); it comes back advanced by the item's tiles. K_{j+1}
// is loaded before V_j: a consumer frees V_j's slot only after its P V, late
// in its next tile, and K_{j+1} must not wait behind that in this one thread.
// Packed sequences: keys past the sequence's end (the next one's) are masked.
template <class C>
__device__ __forceinline__ void load_kv(const TmaDesc& tk, const TmaDesc& tv, const AttnArgs& a,
                                        const SmemLayout<C>& sm, const Work& it, int& ring) {
  const int hk = it.h / a.h_per_kv, tb = tma_batch_of<C>(it), k_row = k_row_of<C>(it);
  // A K tile (and a 16-bit V tile): BN rows of keys in CB column blocks of the head dim. An FP8 V tile
  // comes from V^T: D rows in CBV column blocks of keys.
  auto load = [&](const TmaDesc& t, uint32_t dst, uint32_t empty, uint32_t full, int j, bool transposed) {
    const uint32_t phase = ((ring + j) / C::STAGES) & 1;
    mbar_wait(empty, phase ^ 1);  // a fresh barrier counts as released
    mbar_expect_tx(full, C::KV_BYTES);
    const int key0 = (it.n0 + j) * C::BN + k_row;
    if (transposed) {
#pragma unroll
      for (int cb = 0; cb < C::CBV; ++cb) tma_load(dst + cb * C::D * C::SWB, &t, full, key0 + cb * C::E, 0, hk, tb);
    } else {
#pragma unroll
      for (int cb = 0; cb < C::CB; ++cb) tma_load(dst + cb * C::BN * C::SWB, &t, full, cb * C::E, key0, hk, tb);
    }
  };
  auto load_k = [&](int j) {
    const int s = (ring + j) % C::STAGES;
    load(tk, sm.sK + s * C::KV_BYTES, sm.k_empty(s), sm.k_full(s), j, false);
  };
  auto load_v = [&](int j) {
    const int s = (ring + j) % C::STAGES;
    load(tv, sm.sV + s * C::KV_BYTES, sm.v_empty(s), sm.v_full(s), j, C::FP8);
  };
  if (it.n_tiles > 0) load_k(0);
  for (int j = 0; j < it.n_tiles; ++j) {
    if (j + 1 < it.n_tiles) load_k(j + 1);
    load_v(j);
  }
  ring += it.n_tiles;
}

// Each consumer's Q rows of one work item; `round` counts the items loaded
// before this one. Packed sequences: rows past the sequence's end are the next
// sequence's (or zeros past the tensor): computed, never stored.
template <class C>
__device__ __forceinline__ void load_q(const TmaDesc& tq, const SmemLayout<C>& sm, const Work& it, int round) {
  for (int c = 0; c < C::CONSUMERS; ++c) {
    mbar_wait(sm.q_empty(c), (round & 1) ^ 1);
    if constexpr (TileScheduler<C>::WARP_WALK) post_item(sm, c, it);
    mbar_expect_tx(sm.q_full(c), C::Q_BYTES / C::CONSUMERS);
#pragma unroll
    for (int cb = 0; cb < C::CB; ++cb)
      tma_load(sm.sQ + cb * C::BM * C::SWB + c * C::Q_ROWS * C::SWB, &tq, sm.q_full(c), cb * C::E,
               q_row_of<C>(it) + it.m0 + c * C::Q_ROWS, it.h, tma_batch_of<C>(it));
  }
}

// Warpgroup 0; it gives registers back to the consumers first (SPLIT_REGS).
template <class C>
__device__ __forceinline__ void producer(const TmaDesc& tq, const TmaDesc& tk, const TmaDesc& tv, const AttnArgs& a,
                                         const SmemLayout<C>& sm, const TileScheduler<C>& sched, int tid) {
  if constexpr (C::SPLIT_REGS) setmaxnreg_dec<C::PRODUCER_REGS>();
  // Two loader threads, so that neither waits behind the other: one streams
  // K/V tiles into the ring, the other loads each consumer's Q rows as soon
  // as that consumer has written out its previous item (the epilogue stages
  // O in those rows). WARP_WALK: the scheduler's walk takes whole warps, so
  // warps 0 and 1 walk it and their lane 0 is the loader thread.
  constexpr bool WHOLE = TileScheduler<C>::WARP_WALK;
  const bool loader = !WHOLE || tid % 32 == 0;
  if (WHOLE ? tid < 32 : tid == 0) {
    if (loader) {
      tma_prefetch_map(&tk);
      tma_prefetch_map(&tv);
    }
    int ring = 0;
    Work it;
    for (int r = 0; sched.work_at(r, it); ++r) {
      if (it.skip) continue;
      if (loader) load_kv<C>(tk, tv, a, sm, it, ring);
    }
  } else if (WHOLE ? tid < 64 : tid == 32) {
    if (loader) tma_prefetch_map(&tq);
    Work it;
    int posted = 0;  // WHOLE: the items posted to the consumers (item_mail.h)
    for (int r = 0, round = 0; sched.work_at(r, it); ++r) {
      if (it.skip) continue;
      if (loader) load_q<C>(tq, sm, it, round);
      posted = ++round;
    }
    if constexpr (WHOLE)
      if (loader) post_end(sm, posted);
  }
}

}  // namespace fc
