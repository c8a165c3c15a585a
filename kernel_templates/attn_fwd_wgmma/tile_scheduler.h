// Which work items a CTA computes. A work item is (query tile, head, batch):
// one per CTA (heaviest causal tiles first), or, persistent, about one CTA
// per SM going through its share of them, so that one item's epilogue
// overlaps the next one's K/V loads and the other consumers' work.
#pragma once

#include "../common/attn_args.h"

namespace fc {

struct Work {
  int m0, h, b, n0, n_tiles;  // key tiles n0 .. n0 + n_tiles - 1 (a window skips the others)
  bool skip;  // the empty second half of a causal unit (the middle tile has no partner)
};

// Persistent CTAs take units of consecutive items of one head, strided
// across the grid: concurrent CTAs share heads (K/V stay in L2). A causal
// unit pairs query tile q with tile m_blocks - 1 - q: every unit costs
// about the same, so static striding stays balanced.
template <class C>
struct TileScheduler {
  static constexpr int UNIT_ITEMS = C::PERSISTENT && C::CAUSAL ? 2 : 1;
  const AttnArgs& a;
  int m_blocks, units_per_head, n_units;

  __device__ __forceinline__ explicit TileScheduler(const AttnArgs& args) : a(args) {
    m_blocks = (a.sq + C::BM - 1) / C::BM;
    units_per_head = C::PERSISTENT && C::CAUSAL ? (m_blocks + 1) / 2 : m_blocks;
    n_units = C::PERSISTENT ? units_per_head * a.heads * a.batch : 1;
  }

  // The r-th work item of this CTA; false once it has none left. Producer
  // threads and consumers walk the same sequence.
  __device__ __forceinline__ bool work_at(int r, Work& it) const {
    int m_block;
    it.skip = false;
    if constexpr (C::PERSISTENT) {
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
    }
    it.m0 = m_block * C::BM;
    const int p_lo = it.m0 + a.sk - a.sq;  // key-aligned positions of the item's first and last rows
    it.n0 = C::Keys::first(p_lo) / C::BN;
    it.n_tiles = max(0, (C::Keys::end(p_lo + C::BM - 1, a.sk) + C::BN - 1) / C::BN - it.n0);
    return true;
  }
};

}  // namespace fc
