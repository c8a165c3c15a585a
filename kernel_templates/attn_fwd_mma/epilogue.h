// The epilogue of the mma template: each warp's O normalised and stored (through shared memory, in 16-byte
// rows) with lse; where the keys were split across warps (KV_SPLIT > 1), their partial results merged first.
#pragma once

#include <stdint.h>

#include "../common/attn_args.h"
#include "../common/utils.h"
#include "../common/warp_tile.h"

namespace fc {

// Where a thread's rows sit: the block's first query row m0, the warp's first row in the block (row_base) and
// key split (wn), the lane's fragment coordinates (g, t), batch b and head h; the softmax scale of the scores
// the warp held (natural units; a softcap's when there is one) and in log2 units.
struct RowPlace {
  int m0, row_base, wn, g, t, b, h;
  float scale, scale_log2;
};

// lse of the block's row `row` (natural units): row max m (the scores' units) and sum l; -inf for a row that
// saw no key.
__device__ __forceinline__ void store_lse(const AttnArgs& a, const RowPlace& at, int row, float m, float l) {
  a.lse[((long long)at.b * gridDim.y + at.h) * a.sq + row] = l > 0.f ? m * at.scale + logf(l) : NEG_INF;
}

// Rows of Q's tile as 16-byte chunks from shared memory (layout L) to O's rows m0 .. m0 + BM (those < Sq).
template <class C, class Chunk>
__device__ __forceinline__ void store_o(const AttnArgs& a, typename C::T* o, int m0, Chunk&& chunk) {
  constexpr int CHUNKS_PER_ROW = C::D / 8;
  for (int i = threadIdx.x; i < C::BM * CHUNKS_PER_ROW; i += C::THREADS) {
    const int r = i / CHUNKS_PER_ROW, c = (i % CHUNKS_PER_ROW) * 8;
    if (m0 + r < a.sq) *reinterpret_cast<uint4*>(o + (long long)(m0 + r) * a.o_ss + c) = chunk(r, c);
  }
}

// KV_SPLIT == 1: the warp's rows are whole; O / l into Q's tile (free: every warp is done with it), then out.
template <class C>
__device__ __forceinline__ void epilogue_rows(const WarpState<C>& st, const AttnArgs& a, const RowPlace& at,
                                              typename C::T* sQ, typename C::T* o) {
  using L = typename C::Layout;
#pragma unroll
  for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float l = st.row_sum[mt][r];
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int row_t = at.row_base + mt * 16 + at.g + r * 8;
#pragma unroll
      for (int dt = 0; dt < C::DT; ++dt) {
        const int col = dt * 8 + 2 * at.t;
        *reinterpret_cast<uint32_t*>(sQ + L::offset(row_t, col & ~7) + (col & 7)) =
            pack2<typename C::T>(st.acc_o[mt][dt][2 * r] * inv, st.acc_o[mt][dt][2 * r + 1] * inv);
      }
      const int row = at.m0 + row_t;
      if (a.lse != nullptr && at.t == 0 && row < a.sq) store_lse(a, at, row, st.row_max[mt][r], l);
    }
  __syncthreads();
  store_o<C>(a, o, at.m0, [&](int r, int c) { return *reinterpret_cast<const uint4*>(sQ + L::offset(r, c)); });
}

// KV_SPLIT > 1: keys were split across warps; their partial (max, sum, O) merged in shared memory (the K/V
// ring reused: fp32 O [BM][D], then each split's row max and sum), then out.
template <class C>
__device__ __forceinline__ void epilogue_split(const WarpState<C>& st, const AttnArgs& a, const RowPlace& at,
                                               unsigned char* smem_raw, typename C::T* o) {
  float* s_acc = reinterpret_cast<float*>(smem_raw + C::Q_TILE * sizeof(typename C::T));  // [BM][D]
  float* s_max = s_acc + C::BM * C::D;                                                    // [KV_SPLIT][BM]
  float* s_sum = s_max + C::KV_SPLIT * C::BM;                                             // [KV_SPLIT][BM]
  for (int i = threadIdx.x; i < C::BM * C::D; i += C::THREADS) s_acc[i] = 0.f;
#pragma unroll
  for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      if (at.t == 0) {
        const int row_t = at.row_base + mt * 16 + at.g + r * 8;
        s_max[at.wn * C::BM + row_t] = st.row_max[mt][r];
        s_sum[at.wn * C::BM + row_t] = st.row_sum[mt][r];
      }
  __syncthreads();
#pragma unroll
  for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row_t = at.row_base + mt * 16 + at.g + r * 8;
      float m_all = NEG_INF;
#pragma unroll
      for (int s = 0; s < C::KV_SPLIT; ++s) m_all = fmaxf(m_all, s_max[s * C::BM + row_t]);
      const float m_scaled = (m_all == NEG_INF) ? 0.f : m_all * at.scale_log2;
      float l_all = 0.f;
#pragma unroll
      for (int s = 0; s < C::KV_SPLIT; ++s)
        l_all += s_sum[s * C::BM + row_t] * fast_exp2(s_max[s * C::BM + row_t] * at.scale_log2 - m_scaled);
      const float factor = l_all > 0.f ? fast_exp2(st.row_max[mt][r] * at.scale_log2 - m_scaled) / l_all : 0.f;
#pragma unroll
      for (int dt = 0; dt < C::DT; ++dt) {
        const int col = dt * 8 + 2 * at.t;
        atomicAdd(s_acc + row_t * C::D + col, st.acc_o[mt][dt][2 * r] * factor);
        atomicAdd(s_acc + row_t * C::D + col + 1, st.acc_o[mt][dt][2 * r + 1] * factor);
      }
      const int row = at.m0 + row_t;
      if (at.wn == 0 && a.lse != nullptr && at.t == 0 && row < a.sq) store_lse(a, at, row, m_all, l_all);
    }
  __syncthreads();
  store_o<C>(a, o, at.m0, [&](int r, int c) {
    const float* src = s_acc + r * C::D + c;
    using T = typename C::T;
    return make_uint4(pack2<T>(src[0], src[1]), pack2<T>(src[2], src[3]), pack2<T>(src[4], src[5]),
                      pack2<T>(src[6], src[7]));
  });
}

}  // namespace fc
