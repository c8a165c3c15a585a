// dQ of one query tile: dQ_tile = dS K over the CTA's keys, the BM x D tile split across warps (WQ_M x WQ_N), then
// added into the fp32 accumulator dq_accum [B, H, Sq, D] with fp32 atomics (red.global.add.f32: other CTAs, the
// other key blocks, add into the same rows). The softmax scale is applied by the conversion kernel (rows.h).
#pragma once

#include <stdint.h>

#include "../common/ptx_sm80.h"
#include "../common/warp_tile.h"

namespace fc {

// ds_base, k_base: shared addresses of the dS^T tile (BN key rows of BM queries) and of the K tile; dq_rows: the
// (batch, head)'s dq_accum rows; m0: the tile's first query row.
template <class C>
__device__ __forceinline__ void tile_dq(uint32_t ds_base, uint32_t k_base, float* dq_rows, int m0, int sq, int warp,
                                        int lane) {
  using T = typename C::T;
  using L = typename C::Layout;
  using DL = typename C::DsLayout;
  const int row0 = (warp % C::WQ_M) * C::MQ * 16, col0 = (warp / C::WQ_M) * C::NQ * 8;
  // A (dS, queries x keys) from dS^T's rows by ldmatrix.trans: two 8-key halves, two 8-query chunks; B (K, keys x d)
  // by ldmatrix.trans as the forward reads V: two 8-key halves, two d chunks.
  const int ds_r = (lane / 16) * 8 + lane % 8;
  const uint32_t ds_rb = ds_base + ds_r * DL::ROW_BYTES, ds_cb = DL::chunk_bytes(ds_r, (lane / 8) % 2);
  const int k_r = ((lane / 8) % 2) * 8 + lane % 8;
  const uint32_t k_rb = k_base + k_r * L::ROW_BYTES, k_cb = L::chunk_bytes(k_r, lane / 16);

  float acc[C::MQ][C::NQ][4];
  zero_acc(acc);
#pragma unroll
  for (int kk = 0; kk < C::BN / 16; ++kk) {
    uint32_t a_frag[C::MQ][4];
#pragma unroll
    for (int mq = 0; mq < C::MQ; ++mq) ldmatrix_x4_trans(a_frag[mq], DL::addr(ds_rb, ds_cb, kk * 16, row0 + mq * 16));
#pragma unroll
    for (int dp = 0; dp < C::NQ / 2; ++dp) {
      uint32_t b_frag[4];
      ldmatrix_x4_trans(b_frag, L::addr(k_rb, k_cb, kk * 16, col0 + dp * 16));
      mma_x2<T>(acc, 2 * dp, a_frag, b_frag);
    }
  }

  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mq = 0; mq < C::MQ; ++mq)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = m0 + row0 + mq * 16 + g + r * 8;
      if (row >= sq) continue;
      float* dst = dq_rows + (long long)row * C::D + col0 + 2 * t;
#pragma unroll
      for (int nq = 0; nq < C::NQ; ++nq) {
        atomicAdd(dst + nq * 8, acc[mq][nq][2 * r]);
        atomicAdd(dst + nq * 8 + 1, acc[mq][nq][2 * r + 1]);
      }
    }
}

}  // namespace fc
