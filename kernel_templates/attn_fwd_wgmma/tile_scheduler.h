// Which work items a CTA computes. A work item is (query tile, head, batch):
// one per CTA (heaviest causal tiles first), or, persistent, about one CTA
// per SM going through its share of them, so that one item's epilogue
// overlaps the next one's K/V loads and the other consumers' work.
#pragma once

#include "../common/attn_args.h"
#include "packed_order.h"

namespace fc {

struct Work {
  int m0, h, b, n0, n_tiles;  // key tiles n0 .. n0 + n_tiles - 1 (a window skips the others)
  bool skip;  // the empty second half of a causal unit (the middle tile has no partner), or an empty item
  // Packed sequences only (C::PACKED): the sequence's lengths and its first query and key rows in the
  // [total, H, D] tensors. Dense items read the call's lengths (item_sq / item_sk) and leave these unset.
  int sq, sk, q_row, k_row;
};

// The query and key lengths an item's rows and keys are bounded by; the rows of its sequence start at
// q_row_of (the tensor maps' row coordinate), and tma_batch_of is its batch coordinate in the maps.
template <class C>
__device__ __forceinline__ int item_sq(const AttnArgs& a, const Work& it) {
  if constexpr (C::PACKED) return it.sq;
  return a.sq;
}
template <class C>
__device__ __forceinline__ int item_sk(const AttnArgs& a, const Work& it) {
  if constexpr (C::PACKED) return it.sk;
  return a.sk;
}
template <class C>
__device__ __forceinline__ int q_row_of(const Work& it) {
  if constexpr (C::PACKED) return it.q_row;
  return 0;
}
template <class C>
__device__ __forceinline__ int k_row_of(const Work& it) {
  if constexpr (C::PACKED) return it.k_row;
  return 0;
}
template <class C>
__device__ __forceinline__ int tma_batch_of(const Work& it) {
  if constexpr (C::PACKED) return 0;  // the packed tensors are one batch row of `total` rows
  return it.b;
}

// Persistent CTAs take units of consecutive items of one head, strided
// across the grid: concurrent CTAs share heads (K/V stay in L2). A causal
// unit pairs query tile q with tile m_blocks - 1 - q: every unit costs
// about the same, so static striding stays balanced. Packed sequences, one
// CTA per item: the grid is the longest sequence's; a shorter one's query
// tiles past its end are CTAs that exit. Packed and persistent: only the real
// items, longest first, dealt in a snake (packed_order.h); whole warps walk: the producer's two loader
// warps, and each consumer warp once for its last busy item; the Q loader posts the items to the consumers
// (item_mail.h).
template <class C>
struct TileScheduler {
  static constexpr int UNIT_ITEMS = C::PERSISTENT && C::CAUSAL ? 2 : 1;
  static constexpr bool WARP_WALK = C::PACKED && C::PERSISTENT;  // every lane of a calling warp calls work_at
  const AttnArgs& a;
  int m_blocks, units_per_head, n_units;
  PackedOrder<C> order;  // WARP_WALK only

  __device__ __forceinline__ explicit TileScheduler(const AttnArgs& args)
      : a(args), order(args, (args.sq + C::BM - 1) / C::BM) {
    m_blocks = (a.sq + C::BM - 1) / C::BM;
    units_per_head = C::PERSISTENT && C::CAUSAL ? (m_blocks + 1) / 2 : m_blocks;
    n_units = C::PERSISTENT ? units_per_head * a.heads * a.batch : 1;
  }

  // The r-th work item of this CTA; false once it has none left. Producer
  // threads and consumers walk the same sequence.
  __device__ __forceinline__ bool work_at(int r, Work& it) const {
    int m_block;
    it.skip = false;
    if constexpr (WARP_WALK) {
      if (!order.find(item_index(r), it.b, it.h, m_block)) return false;
      locate(it);
    } else if constexpr (C::PERSISTENT) {
      const int unit = blockIdx.x + r / UNIT_ITEMS * gridDim.x;
      if (unit >= n_units) return false;
      const int hb = unit / units_per_head, q = unit % units_per_head;
      it.h = hb % a.heads;
      it.b = hb / a.heads;
      if constexpr (C::CAUSAL) {
        m_block = r % 2 == 0 ? m_blocks - 1 - q : q;
        it.skip = r % 2 == 1 && q == m_blocks - 1 - q;
      } else {
        m_block = q;
      }
    } else {
      if (r > 0) return false;
      m_block = gridDim.x - 1 - blockIdx.x;
      it.h = blockIdx.y;
      it.b = blockIdx.z;
      if constexpr (C::PACKED) {
        if (m_block >= locate(it)) return false;  // past this sequence's end: the CTA has nothing to do
      }
    }
    it.m0 = m_block * C::BM;
    key_span(it);
    return true;
  }

  // The key tiles an item's rows see (n0, n_tiles), from its first row and lengths.
  __device__ __forceinline__ void key_span(Work& it) const {
    const int sq = item_sq<C>(a, it), sk = item_sk<C>(a, it);
    const int p_lo = it.m0 + sk - sq;  // key-aligned positions of the item's first and last rows
    it.n0 = tiles<C::BN>(C::Keys::first(p_lo));
    it.n_tiles = max(0, tiles<C::BN>(C::Keys::end(p_lo + C::BM - 1, sk) + C::BN - 1) - it.n0);
  }

  // WARP_WALK: the position of this CTA's r-th item in the order, dealt in a snake (packed_order.h).
  __device__ __forceinline__ static int item_index(int r) {
    const int g = gridDim.x, x = blockIdx.x;
    return r * g + (r % 2 == 0 ? x : g - 1 - x);
  }

  // WARP_WALK: the last of this CTA's items with keys to read (its last ping-pong turn), or -1. Searched from
  // the order's end (the last level's count, not a walk over every item); the next walk starts at the top.
  __device__ __forceinline__ int last_busy(Work& it) const {
    const int n_items = order.total(), g = gridDim.x, rounds = n_items / g;
    int r = rounds - (item_index(rounds) < n_items ? 0 : 1);
    order.seek_end(n_items);
    for (; r >= 0; --r) {
      work_at(r, it);
      if (it.n_tiles > 0) break;
    }
    return r;
  }

  // Packed: the item's sequence offsets and lengths, from the cumulative lengths; its query tiles.
  __device__ __forceinline__ int locate(Work& it) const {
    it.q_row = a.cu_q[it.b];
    it.k_row = a.cu_k[it.b];
    it.sq = a.cu_q[it.b + 1] - it.q_row;
    it.sk = a.cu_k[it.b + 1] - it.k_row;
    return tiles<C::BM>(it.sq + C::BM - 1);
  }

  // n / N of an n >= 0 (a key bound, a length): unsigned, a signed division costs a sign fix-up. Persistent
  // CTAs keep the signed one: unsigned, ptxas's persistent loops grew by 2-3 a tile (D128, D64 causal).
  template <int N>
  __device__ __forceinline__ static int tiles(int n) {
    return C::PERSISTENT ? n / N : static_cast<int>(static_cast<uint32_t>(n) / N);
  }
};

}  // namespace fc
