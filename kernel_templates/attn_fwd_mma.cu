// FlashAttention-2-style fused attention forward pass for sm_80 and newer.
//
// Tensor cores through mma.sync m16n8k16 (fp32 accumulation) fed by ldmatrix;
// K/V tiles brought into shared memory by cp.async in a STAGES-deep ring
// (attn_fwd_mma/load_tile.h); online softmax in registers with exp2. Every
// tunable is a template parameter (attn_fwd_mma/config.h): the tuner appends
// one `extern "C"` instantiation per variant (see tuner/kernels/render.py),
// so the compiler type-checks each of them.
//
// Problem: see common/attn_args.h. Causal masking is bottom-right aligned:
// query i sees key j iff j <= i + (Sk - Sq). Rows that see no key produce 0
// and lse = -inf.

#include "attn_fwd_mma/config.h"
#include "attn_fwd_mma/load_tile.h"
#include "common/attn_args.h"
#include "common/ptx_sm80.h"
#include "common/tree_reduce.h"
#include "common/utils.h"
#include "common/warp_tile.h"

namespace fc {

// Main loop and epilogue in one function on purpose: an epilogue function
// taking the accumulators by reference changed the registers and SASS nvcc
// produced for most variants.
template <class C>
__device__ __forceinline__ void attn_fwd(const AttnArgs& a) {
  using T = typename C::T;
  using L = typename C::Layout;
  using M = Mma<T>;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + C::Q_TILE;
  T* sV = sK + C::STAGES * C::KV_TILE;

  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  const int wm = warp % C::WARPS_M, wn = warp / C::WARPS_M;
  const int g = lane / 4, t = lane % 4;  // mma fragment coordinates

  // Causal: the heaviest query blocks (most keys) are scheduled first.
  const int m_block = C::CAUSAL ? (int)gridDim.x - 1 - (int)blockIdx.x : (int)blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z;
  const int hk = h / a.h_per_kv;
  const int m0 = m_block * C::BM;
  const int diag = a.sk - a.sq;  // bottom-right alignment offset

  const T* q = static_cast<const T*>(a.q) + b * a.q_sb + h * a.q_sh;
  const T* k = static_cast<const T*>(a.k) + b * a.k_sb + hk * a.k_sh;
  const T* v = static_cast<const T*>(a.v) + b * a.v_sb + hk * a.v_sh;
  T* o = static_cast<T*>(a.o) + b * a.o_sb + h * a.o_sh;

  int n_end = a.sk;
  if (C::CAUSAL) n_end = min(a.sk, max(0, m0 + C::BM + diag));
  const int n_tiles = (n_end + C::BN - 1) / C::BN;

  // Q first (its own cp.async group), then the K/V prologue.
  load_tile<C, C::BM>(sQ, q, a.q_ss, m0, a.sq);
  cp_async_commit();
#pragma unroll
  for (int s = 0; s < C::STAGES - 1; ++s) {
    if (s < n_tiles) load_tile<C, C::BN>(sK + s * C::KV_TILE, k, a.k_ss, s * C::BN, a.sk);
    cp_async_commit();
    if (s < n_tiles) load_tile<C, C::BN>(sV + s * C::KV_TILE, v, a.v_ss, s * C::BN, a.sk);
    cp_async_commit();
  }

  const int row_base = wm * C::ROWS_PER_WARP;   // first row of this warp in the tile
  const int key_base = wn * C::KEYS_PER_WARP;   // first key of this warp in a K/V tile

  // Per-thread ldmatrix bases (see TileLayout::addr). A (Q): rows r..r+15 in
  // two 8-row halves, chunks k..k+1; B of Q.K^T (K, non-transposed): two
  // 8-key groups; B of P.V (V, transposed): two 8-key halves, two d chunks.
  const int q_row0 = row_base + (lane % 8) + ((lane / 8) % 2) * 8;
  const uint32_t q_rb = smem_u32(sQ) + q_row0 * L::ROW_BYTES, q_cb = L::chunk_bytes(q_row0, lane / 16);
  const int k_row0 = key_base + (lane / 16) * 8 + (lane % 8);
  const uint32_t k_rb = smem_u32(sK) + k_row0 * L::ROW_BYTES, k_cb = L::chunk_bytes(k_row0, (lane / 8) % 2);
  const int v_row0 = key_base + ((lane / 8) % 2) * 8 + (lane % 8);
  const uint32_t v_rb = smem_u32(sV) + v_row0 * L::ROW_BYTES, v_cb = L::chunk_bytes(v_row0, lane / 16);
  constexpr uint32_t KV_TILE_BYTES = C::KV_TILE * 2;

  uint32_t q_frag[C::Q_IN_REGS ? C::MT : 1][C::Q_IN_REGS ? C::KD : 1][4];
  if constexpr (C::Q_IN_REGS) {
    cp_async_wait<2 * (C::STAGES - 1)>();
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
      for (int kd = 0; kd < C::KD; ++kd) ldmatrix_x4(q_frag[mt][kd], L::addr(q_rb, q_cb, mt * 16, kd * 16));
  }

  float acc_o[C::MT][C::DT][4];
  float row_max[C::MT][2], row_sum[C::MT][2];
#pragma unroll
  for (int mt = 0; mt < C::MT; ++mt) {
#pragma unroll
    for (int dt = 0; dt < C::DT; ++dt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc_o[mt][dt][i] = 0.f;
    row_max[mt][0] = row_max[mt][1] = NEG_INF;
    row_sum[mt][0] = row_sum[mt][1] = 0.f;
  }
  const float scale_log2 = a.scale * LOG2E;

  // Barriers per K/V tile: with STAGES >= 2, one (tile j landed everywhere
  // and every warp is done with tile j-1, whose slot the prefetch refills);
  // with STAGES == 1 the single slot forces load -> wait -> use -> release.
  for (int j = 0; j < n_tiles; ++j) {
    const int slot = j % C::STAGES;
    if constexpr (C::STAGES == 1) {
      load_tile<C, C::BN>(sK, k, a.k_ss, j * C::BN, a.sk);
      cp_async_commit();
      load_tile<C, C::BN>(sV, v, a.v_ss, j * C::BN, a.sk);
      cp_async_commit();
      cp_async_wait<1>();  // Q and K_j have landed; V_j may still be in flight
    } else {
      cp_async_wait<2 * (C::STAGES - 2)>();  // Q, K_j and V_j have landed
    }
    __syncthreads();
    if constexpr (C::STAGES > 1) {
      const int jn = j + C::STAGES - 1;  // prefetch into the slot tile j-1 used
      const int slot_n = jn % C::STAGES;
      if (jn < n_tiles) load_tile<C, C::BN>(sK + slot_n * C::KV_TILE, k, a.k_ss, jn * C::BN, a.sk);
      cp_async_commit();
      if (jn < n_tiles) load_tile<C, C::BN>(sV + slot_n * C::KV_TILE, v, a.v_ss, jn * C::BN, a.sk);
      cp_async_commit();
    }

    const uint32_t slot_bytes = (uint32_t)slot * KV_TILE_BYTES;
    const uint32_t tk_rb = k_rb + slot_bytes, tv_rb = v_rb + slot_bytes;

    // ---- S = Q K^T for this warp's rows x keys
    float acc_s[C::MT][C::NT][4];
    zero_acc(acc_s);

#pragma unroll
    for (int kd = 0; kd < C::KD; ++kd) {
      uint32_t a_frag[C::MT][4];
#pragma unroll
      for (int mt = 0; mt < C::MT; ++mt) {
        if constexpr (C::Q_IN_REGS) {
#pragma unroll
          for (int i = 0; i < 4; ++i) a_frag[mt][i] = q_frag[mt][kd][i];
        } else {
          ldmatrix_x4(a_frag[mt], L::addr(q_rb, q_cb, mt * 16, kd * 16));
        }
      }
#pragma unroll
      for (int np = 0; np < C::NT / 2; ++np) {
        uint32_t b_frag[4];
        ldmatrix_x4(b_frag, L::addr(tk_rb, k_cb, np * 16, kd * 16));
#pragma unroll
        for (int mt = 0; mt < C::MT; ++mt) {
          M::run(acc_s[mt][2 * np], a_frag[mt], b_frag[0], b_frag[1]);
          M::run(acc_s[mt][2 * np + 1], a_frag[mt], b_frag[2], b_frag[3]);
        }
      }
    }

    // ---- masks: key tail, and the causal diagonal (only on tiles that need it)
    const int n0 = j * C::BN;
    const bool tail = n0 + C::BN > a.sk;
    const bool on_diag = C::CAUSAL && (n0 + C::BN - 1 > m0 + diag);
    if (tail || on_diag) {
#pragma unroll
      for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = m0 + row_base + mt * 16 + g + r * 8;
          const int limit = C::CAUSAL ? min(a.sk, row + diag + 1) : a.sk;
#pragma unroll
          for (int nt = 0; nt < C::NT; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int key = n0 + key_base + nt * 8 + 2 * t + e;
              if (key >= limit) acc_s[mt][nt][2 * r + e] = NEG_INF;
            }
        }
    }

    // ---- online softmax (row stats kept per thread-quad; sums reduced at the end)
    float alphas[C::MT][2];
#pragma unroll
    for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        // Pairwise (tree) reductions: a sequential chain over the row's
        // 2*NT values would serialise on the FMNMX/FADD latency.
        float vals[2 * C::NT];
#pragma unroll
        for (int nt = 0; nt < C::NT; ++nt) {
          vals[2 * nt] = acc_s[mt][nt][2 * r];
          vals[2 * nt + 1] = acc_s[mt][nt][2 * r + 1];
        }
        TreeReduce<C::NT>::run(vals, MaxOp());
        float mx = fmaxf(row_max[mt][r], vals[0]);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
        // A row that has seen only masked keys keeps max -inf: use 0 as the
        // exponent offset so exp2 yields 0 instead of NaN.
        const float m_scaled = (mx == NEG_INF) ? 0.f : mx * scale_log2;
        const float alpha = fast_exp2(row_max[mt][r] * scale_log2 - m_scaled);
        row_max[mt][r] = mx;
#pragma unroll
        for (int nt = 0; nt < C::NT; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float p = fast_exp2(fmaf(acc_s[mt][nt][2 * r + e], scale_log2, -m_scaled));
            acc_s[mt][nt][2 * r + e] = p;
            vals[2 * nt + e] = p;
          }
        TreeReduce<C::NT>::run(vals, AddOp());
        const float sum = vals[0];
        row_sum[mt][r] = row_sum[mt][r] * alpha + sum;
        alphas[mt][r] = alpha;
      }
    // With LAZY_RESCALE, rescale O only where a row max moved: after the first
    // tiles of a long row it rarely does; the vote keeps the branch warp-uniform.
#pragma unroll
    for (int mt = 0; mt < C::MT; ++mt)
      if (!C::LAZY_RESCALE || __any_sync(0xffffffff, alphas[mt][0] != 1.f || alphas[mt][1] != 1.f)) {
#pragma unroll
        for (int dt = 0; dt < C::DT; ++dt) {
          acc_o[mt][dt][0] *= alphas[mt][0];
          acc_o[mt][dt][1] *= alphas[mt][0];
          acc_o[mt][dt][2] *= alphas[mt][1];
          acc_o[mt][dt][3] *= alphas[mt][1];
        }
      }

    if constexpr (C::STAGES == 1) {
      cp_async_wait<0>();  // V_j has landed
      __syncthreads();
    }

    // ---- O += P V (P converted from the S accumulators, layout-compatible)
#pragma unroll
    for (int kk = 0; kk < C::KN; ++kk) {
      uint32_t p_frag[C::MT][4];
      pack_p_frag<T>(p_frag, acc_s, kk);
#pragma unroll
      for (int dp = 0; dp < C::DT / 2; ++dp) {
        uint32_t b_frag[4];
        ldmatrix_x4_trans(b_frag, L::addr(tv_rb, v_cb, kk * 16, dp * 16));
#pragma unroll
        for (int mt = 0; mt < C::MT; ++mt) {
          M::run(acc_o[mt][2 * dp], p_frag[mt], b_frag[0], b_frag[1]);
          M::run(acc_o[mt][2 * dp + 1], p_frag[mt], b_frag[2], b_frag[3]);
        }
      }
    }
    if constexpr (C::STAGES == 1) __syncthreads();  // the next tile overwrites the only slot
  }
  cp_async_wait<0>();

  // ---- epilogue
#pragma unroll
  for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_sum[mt][r] += __shfl_xor_sync(0xffffffff, row_sum[mt][r], 1);
      row_sum[mt][r] += __shfl_xor_sync(0xffffffff, row_sum[mt][r], 2);
    }
  constexpr int CHUNKS_PER_ROW = C::D / 8;
  constexpr int OUT_CHUNKS = C::BM * CHUNKS_PER_ROW;
  __syncthreads();  // every warp is done reading sQ/sK/sV

  if constexpr (C::KV_SPLIT == 1) {
#pragma unroll
    for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float l = row_sum[mt][r];
        const float inv = l > 0.f ? 1.f / l : 0.f;
        const int row_t = row_base + mt * 16 + g + r * 8;
#pragma unroll
        for (int dt = 0; dt < C::DT; ++dt) {
          const int col = dt * 8 + 2 * t;
          *reinterpret_cast<uint32_t*>(sQ + L::offset(row_t, col & ~7) + (col & 7)) =
              pack2<T>(acc_o[mt][dt][2 * r] * inv, acc_o[mt][dt][2 * r + 1] * inv);
        }
        const int row = m0 + row_t;
        if (a.lse != nullptr && t == 0 && row < a.sq)
          a.lse[((long long)b * gridDim.y + h) * a.sq + row] = l > 0.f ? row_max[mt][r] * a.scale + logf(l) : NEG_INF;
      }
    __syncthreads();
    for (int i = tid; i < OUT_CHUNKS; i += C::THREADS) {
      const int r = i / CHUNKS_PER_ROW, c = (i % CHUNKS_PER_ROW) * 8;
      if (m0 + r < a.sq)
        *reinterpret_cast<uint4*>(o + (long long)(m0 + r) * a.o_ss + c) =
            *reinterpret_cast<const uint4*>(sQ + L::offset(r, c));
    }
  } else {
    // Keys were split across warps: merge their partial (max, sum, O).
    float* s_acc = reinterpret_cast<float*>(smem_raw + C::Q_TILE * sizeof(T));  // [BM][D]
    float* s_max = s_acc + C::BM * C::D;                                        // [KV_SPLIT][BM]
    float* s_sum = s_max + C::KV_SPLIT * C::BM;                                 // [KV_SPLIT][BM]
    for (int i = tid; i < C::BM * C::D; i += C::THREADS) s_acc[i] = 0.f;
#pragma unroll
    for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        if (t == 0) {
          const int row_t = row_base + mt * 16 + g + r * 8;
          s_max[wn * C::BM + row_t] = row_max[mt][r];
          s_sum[wn * C::BM + row_t] = row_sum[mt][r];
        }
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row_t = row_base + mt * 16 + g + r * 8;
        float m_all = NEG_INF;
#pragma unroll
        for (int s = 0; s < C::KV_SPLIT; ++s) m_all = fmaxf(m_all, s_max[s * C::BM + row_t]);
        const float m_scaled = (m_all == NEG_INF) ? 0.f : m_all * scale_log2;
        float l_all = 0.f;
#pragma unroll
        for (int s = 0; s < C::KV_SPLIT; ++s)
          l_all += s_sum[s * C::BM + row_t] * fast_exp2(s_max[s * C::BM + row_t] * scale_log2 - m_scaled);
        const float factor = l_all > 0.f ? fast_exp2(row_max[mt][r] * scale_log2 - m_scaled) / l_all : 0.f;
#pragma unroll
        for (int dt = 0; dt < C::DT; ++dt) {
          const int col = dt * 8 + 2 * t;
          atomicAdd(s_acc + row_t * C::D + col, acc_o[mt][dt][2 * r] * factor);
          atomicAdd(s_acc + row_t * C::D + col + 1, acc_o[mt][dt][2 * r + 1] * factor);
        }
        const int row = m0 + row_t;
        if (wn == 0 && a.lse != nullptr && t == 0 && row < a.sq)
          a.lse[((long long)b * gridDim.y + h) * a.sq + row] = l_all > 0.f ? m_all * a.scale + logf(l_all) : NEG_INF;
      }
    __syncthreads();
    for (int i = tid; i < OUT_CHUNKS; i += C::THREADS) {
      const int r = i / CHUNKS_PER_ROW, c = (i % CHUNKS_PER_ROW) * 8;
      if (m0 + r < a.sq) {
        const float* src = s_acc + r * C::D + c;
        uint4 packed;
        packed.x = pack2<T>(src[0], src[1]);
        packed.y = pack2<T>(src[2], src[3]);
        packed.z = pack2<T>(src[4], src[5]);
        packed.w = pack2<T>(src[6], src[7]);
        *reinterpret_cast<uint4*>(o + (long long)(m0 + r) * a.o_ss + c) = packed;
      }
    }
  }
}

}  // namespace fc

// The tuner appends, for one variant (tuner/kernels/render.py):
//   using TunerCfg = fc::AttnConfig<...>;
//   extern "C" __global__ void __launch_bounds__(TunerCfg::THREADS, TunerCfg::MIN_BLOCKS) <name>(ATTN_FWD_PARAMS)
//   { ATTN_FWD_BODY(TunerCfg) }
#define ATTN_FWD_PARAMS ATTN_FWD_TENSOR_PARAMS

#define ATTN_FWD_BODY(CFG) fc::attn_fwd<CFG>(ATTN_FWD_ARGS((int)gridDim.y, (int)gridDim.z));
