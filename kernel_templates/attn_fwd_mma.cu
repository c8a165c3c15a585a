// FlashAttention-2-style fused attention forward pass for sm_80 and newer.
//
// Tensor cores through mma.sync m16n8k16 (fp32 accumulation) fed by ldmatrix;
// K/V tiles brought into shared memory by cp.async in a STAGES-deep ring
// (attn_fwd_mma/load_tile.h); each warp's share of a tile, S = Q K^T, the
// masks, the online softmax (exp2) and O += P V, is common/warp_tile.h's, as
// in the decode templates. Every tunable is a template parameter
// (attn_fwd_mma/config.h): the tuner appends one `extern "C"` instantiation
// per variant (see tuner/kernels/render.py), so the compiler type-checks each
// of them.
//
// Problem: see common/attn_args.h. Masks (common/mask.h) are bottom-right
// aligned: query i is at key position i + (Sk - Sq); causal, a sliding window
// and a logit softcap are compiled in. Rows that see no key produce 0 and
// lse = -inf.

#include "attn_fwd_mma/config.h"
#include "attn_fwd_mma/epilogue.h"
#include "attn_fwd_mma/load_tile.h"
#include "common/attn_args.h"
#include "common/mask.h"
#include "common/ptx_sm80.h"
#include "common/utils.h"
#include "common/warp_tile.h"

namespace fc {

// K and V of key tile `tile` into ring slot `slot` (when `valid`), each its own cp.async group even when empty,
// so the wait counts stay fixed: V may still be in flight while S = Q K^T runs.
template <class C>
__device__ __forceinline__ void load_kv(typename C::T* sK, typename C::T* sV, const typename C::T* k,
                                        const typename C::T* v, const AttnArgs& a, int tile, int slot, bool valid) {
  if (valid) load_tile<C, C::BN>(sK + slot * C::KV_TILE, k, a.k_ss, tile * C::BN, a.sk);
  cp_async_commit();
  if (valid) load_tile<C, C::BN>(sV + slot * C::KV_TILE, v, a.v_ss, tile * C::BN, a.sk);
  cp_async_commit();
}

template <class C>
__device__ __forceinline__ void attn_fwd(const AttnArgs& a) {
  using T = typename C::T;
  using L = typename C::Layout;

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
  const int p_lo = m0 + diag;    // key position of the block's first row

  const T* q = static_cast<const T*>(a.q) + b * a.q_sb + h * a.q_sh;
  const T* k = static_cast<const T*>(a.k) + b * a.k_sb + hk * a.k_sh;
  const T* v = static_cast<const T*>(a.v) + b * a.v_sb + hk * a.v_sh;
  T* o = static_cast<T*>(a.o) + b * a.o_sb + h * a.o_sh;

  // Key tiles j0 .. j0 + n_tiles - 1: those the block's rows see (the causal limit and a window bound them).
  const int j0 = C::Keys::first(p_lo) / C::BN;
  const int n_tiles = max(0, (C::Keys::end(p_lo + C::BM - 1, a.sk) + C::BN - 1) / C::BN - j0);

  // Q first (its own cp.async group), then the K/V prologue.
  load_tile<C, C::BM>(sQ, q, a.q_ss, m0, a.sq);
  cp_async_commit();
#pragma unroll
  for (int s = 0; s < C::STAGES - 1; ++s) load_kv<C>(sK, sV, k, v, a, j0 + s, s, s < n_tiles);

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
  // Q's A fragment of row block mt, k16 step kd: kept in registers, or reloaded from shared memory.
  auto load_q = [&](uint32_t(&f)[4], int mt, int kd) {
    if constexpr (C::Q_IN_REGS) {
#pragma unroll
      for (int i = 0; i < 4; ++i) f[i] = q_frag[mt][kd][i];
    } else {
      ldmatrix_x4(f, L::addr(q_rb, q_cb, mt * 16, kd * 16));
    }
  };

  WarpState<C> st;
  st.init();
  // The scores' softmax scale (a softcap's when there is one: common/mask.h), and the pre-tanh factor.
  const float scale = C::Cap::softmax_scale(a.scale), scale_log2 = scale * LOG2E;
  const float cap_pre = C::Cap::pre_scale(a.scale);

  // Barriers per K/V tile: with STAGES >= 2, one (tile j landed everywhere
  // and every warp is done with tile j-1, whose slot the prefetch refills);
  // with STAGES == 1 the single slot forces load -> wait -> use -> release.
  for (int j = 0; j < n_tiles; ++j) {
    if constexpr (C::STAGES == 1) {
      load_kv<C>(sK, sV, k, v, a, j0 + j, 0, true);
      cp_async_wait<1>();  // Q and K_j have landed; V_j may still be in flight
    } else {
      cp_async_wait<2 * (C::STAGES - 2)>();  // Q, K_j and V_j have landed
    }
    __syncthreads();
    if constexpr (C::STAGES > 1) {
      const int jn = j + C::STAGES - 1;  // prefetch into the slot tile j-1 used
      load_kv<C>(sK, sV, k, v, a, j0 + jn, jn % C::STAGES, jn < n_tiles);
    }
    const uint32_t slot_bytes = (uint32_t)(j % C::STAGES) * KV_TILE_BYTES;

    // ---- S = Q K^T for this warp's rows x keys, softcapped, masked where the tile is partial
    float acc_s[C::MT][C::NT][4];
    warp_qk<T, L, C::MT, C::NT, C::KD>(acc_s, load_q, k_rb + slot_bytes, k_cb);
    C::Cap::template apply<C::MT * C::NT * 4>(&acc_s[0][0][0], cap_pre);
    const int n0 = (j0 + j) * C::BN;
    if (C::Keys::partial(n0, C::BN, p_lo, p_lo + C::BM - 1, a.sk))
      warp_mask<typename C::Keys>(acc_s, n0 + key_base, g, t, a.sk, [&](int row) { return p_lo + row_base + row; });

    // ---- online softmax (row stats kept per thread-quad; sums reduced at the end)
    float alphas[C::MT][2];
#pragma unroll
    for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        alphas[mt][r] = warp_softmax_row<C::NT>(acc_s[mt], r, st.row_max[mt][r], st.row_sum[mt][r], scale_log2);
    // With LAZY_RESCALE, rescale O only where a row max moved: after the first
    // tiles of a long row it rarely does; the vote keeps the branch warp-uniform.
#pragma unroll
    for (int mt = 0; mt < C::MT; ++mt)
      if (!C::LAZY_RESCALE || __any_sync(0xffffffff, alphas[mt][0] != 1.f || alphas[mt][1] != 1.f)) {
#pragma unroll
        for (int dt = 0; dt < C::DT; ++dt)
#pragma unroll
          for (int i = 0; i < 4; ++i) st.acc_o[mt][dt][i] *= alphas[mt][i / 2];
      }

    if constexpr (C::STAGES == 1) {
      cp_async_wait<0>();  // V_j has landed
      __syncthreads();
    }
    // ---- O += P V (P converted from the S accumulators, layout-compatible)
    warp_pv<T, L, C::MT, C::NT, C::DT>(st.acc_o, acc_s, v_rb + slot_bytes, v_cb);
    if constexpr (C::STAGES == 1) __syncthreads();  // the next tile overwrites the only slot
  }
  cp_async_wait<0>();

  st.quad_sums();
  __syncthreads();  // every warp is done reading sQ/sK/sV
  const RowPlace at{m0, row_base, wn, g, t, b, h, scale, scale_log2};
  if constexpr (C::KV_SPLIT == 1) epilogue_rows<C>(st, a, at, sQ, o);
  else epilogue_split<C>(st, a, at, smem_raw, o);
}

}  // namespace fc

// The tuner appends, for one variant (tuner/kernels/render.py):
//   using TunerCfg = fc::AttnConfig<...>;
//   extern "C" __global__ void __launch_bounds__(TunerCfg::THREADS, TunerCfg::MIN_BLOCKS) <name>(ATTN_FWD_PARAMS)
//   { ATTN_FWD_BODY(TunerCfg) }
#define ATTN_FWD_PARAMS ATTN_FWD_TENSOR_PARAMS

#define ATTN_FWD_BODY(CFG) fc::attn_fwd<CFG>(ATTN_FWD_ARGS((int)gridDim.y, (int)gridDim.z));
