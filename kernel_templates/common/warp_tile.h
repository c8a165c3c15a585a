// One warp's share of a K/V tile with mma.sync m16n8k16 (sm_80 and newer): S = Q K^T, the masks, the
// online-softmax step of one row, and O += P V, with the state a warp carries from tile to tile. The sm_80
// forward (attn_fwd_mma.cu) and the decode templates (attn_decode/tile.h) run their tiles on these. S
// accumulators are [MT][NT][4] (MT row blocks of 16, NT key blocks of 8), O accumulators [MT][DT][4]; K and V
// tiles are addressed through a layout L (row base + chunk offset, L::addr). A thread holds, of each 16-row
// block, rows g and g + 8 (g = lane / 4) and, of each 8-key block, keys 2 t and 2 t + 1 (t = lane % 4).
#pragma once

#include "ptx_sm80.h"
#include "tree_reduce.h"
#include "utils.h"

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

// What a warp carries from K/V tile to tile (C: a config with MT and DT): O (unnormalised) and the online
// softmax's row max and sum (the sum per thread until quad_sums()).
template <class C>
struct WarpState {
  float acc_o[C::MT][C::DT][4];
  float row_max[C::MT][2], row_sum[C::MT][2];

  __device__ __forceinline__ void init() {
    zero_acc(acc_o);
#pragma unroll
    for (int mt = 0; mt < C::MT; ++mt) {
      row_max[mt][0] = row_max[mt][1] = NEG_INF;
      row_sum[mt][0] = row_sum[mt][1] = 0.f;
    }
  }
  // The row sums over the thread quad that shares each row (after the last tile).
  __device__ __forceinline__ void quad_sums() {
#pragma unroll
    for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        row_sum[mt][r] += __shfl_xor_sync(0xffffffff, row_sum[mt][r], 1);
        row_sum[mt][r] += __shfl_xor_sync(0xffffffff, row_sum[mt][r], 2);
      }
  }
};

// acc[mt][n] += A[mt] (b0, b1) and acc[mt][n + 1] += A[mt] (b2, b3) for every row block mt: the two n8 tiles
// of one ldmatrix.x4 of B.
template <class T, int MT, int N>
__device__ __forceinline__ void mma_x2(float (&acc)[MT][N][4], int n, const uint32_t (&a)[MT][4],
                                       const uint32_t (&b)[4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    Mma<T>::run(acc[mt][n], a[mt], b[0], b[1]);
    Mma<T>::run(acc[mt][n + 1], a[mt], b[2], b[3]);
  }
}

// S = Q K^T over the head dim (KD steps of 16): load_a(frag, mt, kd) gives Q's A fragment (from shared
// memory or registers), K's B fragments come by ldmatrix from the tile at (k_rb, k_cb).
template <class T, class L, int MT, int NT, int KD, class LoadA>
__device__ __forceinline__ void warp_qk(float (&acc_s)[MT][NT][4], LoadA&& load_a, uint32_t k_rb, uint32_t k_cb) {
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
      mma_x2<T>(acc_s, 2 * np, a_frag, b_frag);
    }
  }
}

// Scores of keys the rows do not see set to -inf (Keys: a KeyWindow, common/mask.h): kv0 is the warp's first
// key, pos(row) the key-aligned position of the warp's row `row` (0 .. 16 MT). Each row's bounds (first, end)
// are computed once and a score costs one compare (two with a left window), not Keys::hidden's three or four;
// tests/test_mask_logic.py checks that they hide the keys hidden() hides.
template <class Keys, int MT, int NT, class Pos>
__device__ __forceinline__ void warp_mask(float (&acc_s)[MT][NT][4], int kv0, int g, int t, int sk, Pos&& pos) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int p = pos(mt * 16 + g + r * 8);
      const int first = Keys::first(p), end = Keys::end(p, sk);  // the row sees keys first .. end - 1
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int j = kv0 + nt * 8 + 2 * t + e;
          if (j >= end || (Keys::LEFT >= 0 && j < first)) acc_s[mt][nt][2 * r + e] = NEG_INF;
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
#pragma unroll
  for (int kk = 0; kk < NT / 2; ++kk) {
    uint32_t p_frag[MT][4];
    pack_p_frag<T>(p_frag, acc_s, kk);
#pragma unroll
    for (int dp = 0; dp < DT / 2; ++dp) {
      uint32_t b_frag[4];
      ldmatrix_x4_trans(b_frag, L::addr(v_rb, v_cb, kk * 16, dp * 16));
      mma_x2<T>(acc_o, 2 * dp, p_frag, b_frag);
    }
  }
}

}  // namespace fc
