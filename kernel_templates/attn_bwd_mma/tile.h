// One query tile against a CTA's keys, per warp, in the transposed frame: a warp holds KEYS_PER_WARP key rows of
// S^T = K Q^T (so P^T and dS^T sit in the accumulators as the A operand of dV += P^T dO and dK += dS^T Q: no shared
// memory round trip for them), the query columns' lse and delta read from shared memory. Accumulators
// [MT][NT][4]: a thread holds, of each 16-key block, keys g and g + 8 (g = lane / 4) and, of each 8-query block,
// queries 2 t and 2 t + 1 (t = lane % 4).
#pragma once

#include <stdint.h>

#include "../common/mask.h"
#include "../common/utils.h"

namespace fc {

// The query rows [first, end) whose visible keys meet keys [n0, n1) (positions aligned bottom-right: query i at
// key position i + diag), from the row bounds of common/mask.h's KeyWindow: a causal row sees no key right of it,
// a right window RIGHT past it, a left window LEFT before it. Host code too: tests/test_bwd_mma_template.py checks
// it on the CPU against every (row, key) of many shapes.
template <class Keys, bool CAUSAL>
__host__ __device__ __forceinline__ int2 query_range(int n0, int n1, int diag, int sq) {
  int first = 0, end = sq;
  if constexpr (CAUSAL) first = n0 - diag;
  else if constexpr (Keys::RIGHT >= 0) first = n0 - Keys::RIGHT - diag;
  if constexpr (Keys::LEFT >= 0) end = n1 + Keys::LEFT - diag;
  first = first > 0 ? first : 0;
  end = end < sq ? end : sq;
  int2 range;
  range.x = first;
  range.y = end > first ? end : first;
  return range;
}

// A CTA's loop over the query tiles of its K/V head's group (both backward templates): step `it` is query head h
// and first query row m0, from the group's first head hk * h_per_kv, n_m tiles of bm rows from tile m_begin each.
struct QueryTile {
  int h, m0;
};
__device__ __forceinline__ QueryTile query_tile(int it, int hk, int h_per_kv, int m_begin, int n_m, int bm) {
  return QueryTile{hk * h_per_kv + it / n_m, (m_begin + it % n_m) * bm};
}
// The step after `q` (query_tile(it + 1, ...) from query_tile(it, ...), without a division): the next tile of the
// head, or the next head's first. m_first, m_end: the first row of tile m_begin, and of tile m_begin + n_m.
__device__ __forceinline__ QueryTile next_query_tile(QueryTile q, int m_first, int m_end, int bm) {
  return q.m0 + bm < m_end ? QueryTile{q.h, q.m0 + bm} : QueryTile{q.h + 1, m_first};
}

// Scores of S^T the query does not see set to -inf: key0 is the warp's first key, q_pos0 the key-aligned position
// of the tile's query column 0. Each column's bounds (first, end) are computed once (KeyWindow, as warp_mask does
// for rows in common/warp_tile.h).
template <class Keys, int MT, int NT>
__device__ __forceinline__ void mask_transposed(float (&acc)[MT][NT][4], int key0, int q_pos0, int g, int t, int sk) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int p = q_pos0 + nt * 8 + 2 * t + e;
      const int first = Keys::first(p), end = Keys::end(p, sk);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int j = key0 + mt * 16 + g + r * 8;
          if (j >= end || (Keys::LEFT >= 0 && j < first)) acc[mt][nt][2 * r + e] = NEG_INF;
        }
    }
}

// S^T (raw scores) -> P^T in place: softcapped (its derivative 1 - tanh^2 kept in dtanh), masked where `partial`,
// then P = exp2(S * scale_log2 - lse_log2) with the query's lse in log2 units (slse: the tile's BM values; +inf
// for a query that sees no key or lies past Sq, so P = 0 there).
template <class C, class DTanh>
__device__ __forceinline__ void scores_to_p(float (&acc)[C::MT][C::NT][4], DTanh& dtanh, const float* slse,
                                            bool partial, int key0, int q_pos0, int g, int t, int sk, float cap_pre,
                                            float scale_log2) {
  if constexpr (C::Cap::ON) {
#pragma unroll
    for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < C::NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float th = fast_tanh(acc[mt][nt][i] * cap_pre);
          acc[mt][nt][i] = th;
          dtanh[mt][nt][i] = 1.f - th * th;
        }
  }
  if (partial) mask_transposed<typename C::Keys>(acc, key0, q_pos0, g, t, sk);
#pragma unroll
  for (int nt = 0; nt < C::NT; ++nt) {
    const float2 l = *reinterpret_cast<const float2*>(slse + nt * 8 + 2 * t);
#pragma unroll
    for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        acc[mt][nt][2 * r] = fast_exp2(fmaf(acc[mt][nt][2 * r], scale_log2, -l.x));
        acc[mt][nt][2 * r + 1] = fast_exp2(fmaf(acc[mt][nt][2 * r + 1], scale_log2, -l.y));
      }
  }
}

// dP^T -> dS^T in place: dS = P (dP - delta) (times 1 - tanh^2 under a softcap), the gradient of the scores before
// the softmax scale (applied to dK and dQ at the end).
template <class C, class DTanh>
__device__ __forceinline__ void dp_to_ds(float (&dp)[C::MT][C::NT][4], const float (&p)[C::MT][C::NT][4],
                                         const DTanh& dtanh, const float* sdelta, int t) {
#pragma unroll
  for (int nt = 0; nt < C::NT; ++nt) {
    const float2 d = *reinterpret_cast<const float2*>(sdelta + nt * 8 + 2 * t);
#pragma unroll
    for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float ds = p[mt][nt][i] * (dp[mt][nt][i] - (i % 2 ? d.y : d.x));
        if constexpr (C::Cap::ON) ds *= dtanh[mt][nt][i];
        dp[mt][nt][i] = ds;
      }
  }
}

// dS^T (rounded to T) into its shared tile, rows = the warp's keys, for dQ = dS K across warps.
template <class C>
__device__ __forceinline__ void store_ds(typename C::T* sds, const float (&ds)[C::MT][C::NT][4], int key_base, int g,
                                         int t) {
  using DL = typename C::DsLayout;
#pragma unroll
  for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = key_base + mt * 16 + g + r * 8;
#pragma unroll
      for (int nt = 0; nt < C::NT; ++nt)
        *reinterpret_cast<uint32_t*>(sds + DL::offset(row, nt * 8) + 2 * t) =
            pack2<typename C::T>(ds[mt][nt][2 * r], ds[mt][nt][2 * r + 1]);
    }
}

}  // namespace fc
