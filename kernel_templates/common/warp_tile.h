// One warp's share of a K/V tile with mma.sync m16n8k16 (sm_80 and newer): S = Q K^T, the
// online-softmax step of one row, and O += P V. Used by the decode templates (attn_decode/tile.h).
// attn_fwd_mma.cu calls zero_acc and pack_p_frag (its cubins byte-identical) but still writes the three
// loops inline: switched to warp_qk / warp_pv its PTX is the same instruction stream, but ptxas then schedules
// differently (3 of 5 sampled variants' cubins change), so it moves once a GPU run has re-timed it. S accumulators are [MT][NT][4] (MT row blocks of 16, NT key blocks
// of 8), O accumulators [MT][DT][4]; K and V tiles are addressed through a layout L (row base +
// chunk offset, L::addr).
#pragma once

#include "utils.h"
#include "ptx_sm80.h"
#include "tree_reduce.h"

namespace fc {

// Accumulators [MT][NT][4] set to zero (before a product that adds into them).
template <int MT, int NT>
__device__ __forceinline__ void zero_acc(float (&acc)[MT][NT][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.f;
}

// S = Q K^T over the head dim (KD steps of 16): load_a(frag, mt, kd) gives Q's A fragment (from shared
// memory or registers), K's B fragments come by ldmatrix from the tile at (k_rb, k_cb).
template <class T, class L, int MT, int NT, int KD, class LoadA>
__device__ __forceinline__ void warp_qk(float (&acc_s)[MT][NT][4], LoadA&& load_a, uint32_t k_rb, uint32_t k_cb) {
  using M = Mma<T>;
  zero_acc(acc_s);
#pragma unroll
  for (int kd = 0; kd < KD; ++kd) {
    uint32_t a_frag[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) load_a(a_frag[mt], mt, kd);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t b_frag[4];
      ldmatrix_x4(b_frag, L::addr(k_rb, k_cb, np * 16, kd * 16));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        M::run(acc_s[mt][2 * np], a_frag[mt], b_frag[0], b_frag[1]);
        M::run(acc_s[mt][2 * np + 1], a_frag[mt], b_frag[2], b_frag[3]);
      }
    }
  }
}

// The online-softmax step of row r (0: the thread's upper row, 1: lower) of one 16-row block: the
// tile's scores s (log2 units after scale_log2) fold into the running row max and sum (the max is
// shared by the thread quad, the sum stays per thread until the end), the scores become
// probabilities in place, and the factor that rescales the row's O is returned. Pairwise (tree)
// reductions: a sequential chain over the row's 2*NT values would serialise on FMNMX/FADD latency.
template <int NT>
__device__ __forceinline__ float warp_softmax_row(float (&s)[NT][4], int r, float& row_max, float& row_sum,
                                                  float scale_log2) {
  float vals[2 * NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    vals[2 * nt] = s[nt][2 * r];
    vals[2 * nt + 1] = s[nt][2 * r + 1];
  }
  TreeReduce<NT>::run(vals, MaxOp());
  float mx = fmaxf(row_max, vals[0]);
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
  // A row that has seen only masked keys keeps max -inf: 0 as the exponent offset makes exp2 give 0, not NaN.
  const float m_scaled = (mx == NEG_INF) ? 0.f : mx * scale_log2;
  const float alpha = fast_exp2(row_max * scale_log2 - m_scaled);
  row_max = mx;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float p = fast_exp2(fmaf(s[nt][2 * r + e], scale_log2, -m_scaled));
      s[nt][2 * r + e] = p;
      vals[2 * nt + e] = p;
    }
  TreeReduce<NT>::run(vals, AddOp());
  row_sum = row_sum * alpha + vals[0];
  return alpha;
}

// P's A fragments (rounded to T) for keys 16 kk .. 16 kk + 15 of the S accumulators: their layout is the A
// operand's (n8 tiles 2 kk and 2 kk + 1 side by side).
template <class T, int MT, int NT>
__device__ __forceinline__ void pack_p_frag(uint32_t (&p_frag)[MT][4], const float (&acc_s)[MT][NT][4], int kk) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    p_frag[mt][0] = pack2<T>(acc_s[mt][2 * kk][0], acc_s[mt][2 * kk][1]);
    p_frag[mt][1] = pack2<T>(acc_s[mt][2 * kk][2], acc_s[mt][2 * kk][3]);
    p_frag[mt][2] = pack2<T>(acc_s[mt][2 * kk + 1][0], acc_s[mt][2 * kk + 1][1]);
    p_frag[mt][3] = pack2<T>(acc_s[mt][2 * kk + 1][2], acc_s[mt][2 * kk + 1][3]);
  }
}

// O += P V: P from the S accumulators (pack_p_frag), V's B fragments by ldmatrix.trans from the tile at
// (v_rb, v_cb).
template <class T, class L, int MT, int NT, int DT>
__device__ __forceinline__ void warp_pv(float (&acc_o)[MT][DT][4], const float (&acc_s)[MT][NT][4], uint32_t v_rb,
                                        uint32_t v_cb) {
  using M = Mma<T>;
#pragma unroll
  for (int kk = 0; kk < NT / 2; ++kk) {
    uint32_t p_frag[MT][4];
    pack_p_frag<T>(p_frag, acc_s, kk);
#pragma unroll
    for (int dp = 0; dp < DT / 2; ++dp) {
      uint32_t b_frag[4];
      ldmatrix_x4_trans(b_frag, L::addr(v_rb, v_cb, kk * 16, dp * 16));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        M::run(acc_o[mt][2 * dp], p_frag[mt], b_frag[0], b_frag[1]);
        M::run(acc_o[mt][2 * dp + 1], p_frag[mt], b_frag[2], b_frag[3]);
      }
    }
  }
}

}  // namespace fc
