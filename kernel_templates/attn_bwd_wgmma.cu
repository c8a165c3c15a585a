// FlashAttention-3-style attention backward pass for Hopper (sm_90a): wgmma, cp.async loads into 128-byte swizzled
// shared tiles. First version: correctness first (no warp specialisation, no TMA, one wgmma group in flight).
//
// Three kernels, the sm_80 template's parameter list and row kernels (attn_bwd_mma/args.h, rows.h), launched in
// order by tuner/runtime/backward_launch.py:
//   <name>_dot_do_o   delta = rowsum(dO * O) (fp32), lse in log2 units, dQ's fp32 accumulator zeroed;
//   <name>            the main kernel, below: one CTA per (BLOCK_N keys, K/V head, batch);
//   <name>_dq_convert dQ = scale * accumulator, in the inputs' type.
//
// The main kernel keeps its K and V tiles in shared memory and loops over the query tiles (BLOCK_M rows: Q, dO,
// lse and delta through a STAGES-deep cp.async ring) of every query head of its K/V head's GQA group whose rows see
// some of its keys. Each consumer warpgroup owns 64 keys (the M of every wgmma but dQ's) and per tile computes
// S^T, P^T, dP^T, dS^T, dV += P^T dO, dK += dS^T Q, stores dS^T to shared memory, and computes its share of the
// tile's dQ = dS K over all BN keys, added to the fp32 accumulator with vector reductions (attn_bwd_wgmma/tile.h).
// dK (times the scale) and dV go out once at the end, from registers.
//
// GQA as the sm_80 template: a CTA per K/V head loops over its group, dK and dV summed in registers (no fp32
// dK/dV buffers or atomics, deterministic). Causal masking is bottom-right aligned (query i at key position
// i + Sk - Sq), as the forward. No sliding windows or softcap in this version (the manifest says so).

#include "attn_bwd_mma/args.h"
#include "attn_bwd_mma/rows.h"
#include "attn_bwd_mma/tile.h"
#include "attn_bwd_wgmma/config.h"
#include "attn_bwd_wgmma/smem.h"
#include "attn_bwd_wgmma/tile.h"
#include "common/mask.h"
#include "common/ptx_sm80.h"
#include "common/ptx_sm90.h"
#include "common/utils.h"

namespace fc {

// Q, dO (rows past Sq zero-filled), lse_log2 and delta (rows padded to ROW_PAD: no bound) of a query tile into
// ring slot `st` when `valid`; one cp.async group, even when empty, so the wait counts stay fixed.
template <class C>
__device__ __forceinline__ void load_query_tile(const WgSmem<C>& sm, const BwdArgs& a, int b, QueryTile qt, int st,
                                                int sq_pad, bool valid) {
  using T = typename C::T;
  if (valid) {
    load_rows<C, C::BM>(sm.q(st), static_cast<const T*>(a.q) + b * a.q_sb + qt.h * a.q_sh, a.q_ss, qt.m0, a.sq);
    load_rows<C, C::BM>(sm.dout(st), static_cast<const T*>(a.dout) + b * a.do_sb + qt.h * a.do_sh, a.do_ss, qt.m0,
                        a.sq);
    const long long at = ((long long)b * a.heads + qt.h) * sq_pad + qt.m0;
    const int i = threadIdx.x;  // BM / 2 <= 64 < THREADS 16-byte chunks
    if (i < C::BM / 4) cp_async_16(sm.lse(st) + 4 * i, a.lse_log2 + at + 4 * i, true);
    else if (i < C::BM / 2) cp_async_16(sm.delta(st) + 4 * (i - C::BM / 4), a.delta + at + 4 * (i - C::BM / 4), true);
  }
  cp_async_commit();
}

// A warpgroup's dK (times `mul`) or dV rows, rounded to T, straight from the accumulators to global rows < Sk.
template <class C>
__device__ __forceinline__ void acc_to_global(typename C::T* dst, long long stride, const float* acc, float mul,
                                              int key0, int sk) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (key0 + 8 * h >= sk) continue;
    typename C::T* row = dst + (long long)(key0 + 8 * h) * stride + 2 * t;
#pragma unroll
    for (int nb = 0; nb < C::D / 8; ++nb)
      *reinterpret_cast<uint32_t*>(row + nb * 8) =
          pack2<typename C::T>(acc[nb * 4 + 2 * h] * mul, acc[nb * 4 + 2 * h + 1] * mul);
  }
}

template <class C>
__device__ __forceinline__ void attn_bwd_wgmma(const BwdArgs& a) {
  using T = typename C::T;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const WgSmem<C> sm{smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023)};
  const int wg = threadIdx.x / 128, warp_wg = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
  const int hk = blockIdx.y, b = blockIdx.z;
  const int n0 = blockIdx.x * C::BN, diag = a.sk - a.sq;
  const int sq_pad = (a.sq + C::ROW_PAD - 1) / C::ROW_PAD * C::ROW_PAD;
  const int key0 = n0 + wg * 64 + warp_wg * 16 + lane / 4;  // the thread's first key (and key0 + 8)

  // The query tiles whose rows see some of the keys, in each query head of the group.
  const int2 rows = query_range<typename C::Keys, C::CAUSAL>(n0, min(n0 + C::BN, a.sk), diag, a.sq);
  const int m_begin = rows.x / C::BM;
  const int n_m = rows.y > rows.x ? (rows.y + C::BM - 1) / C::BM - m_begin : 0;
  const int n_iters = n_m * a.h_per_kv;

  load_rows<C, C::BN>(sm.k(), static_cast<const T*>(a.k) + b * a.k_sb + hk * a.k_sh, a.k_ss, n0, a.sk);
  load_rows<C, C::BN>(sm.v(), static_cast<const T*>(a.v) + b * a.v_sb + hk * a.v_sh, a.v_ss, n0, a.sk);
  if constexpr (C::STAGES == 2)
    load_query_tile<C>(sm, a, b, query_tile(0, hk, a.h_per_kv, m_begin, max(n_m, 1), C::BM), 0, sq_pad,
                       n_iters > 0);
  else
    cp_async_commit();

  // The warpgroup's K and V rows K-major for S^T and dP^T; the whole K tile MN-major for dQ, and the dS^T tiles.
  const uint32_t k_rows = smem_u32(sm.k()) + wg * 64 * 128, v_rows = smem_u32(sm.v()) + wg * 64 * 128;
  const uint64_t kd = kmajor(k_rows), vd = kmajor(v_rows), kd_mn = mnmajor(smem_u32(sm.k()), C::BN);
  const uint64_t dsd = mnmajor(smem_u32(sm.ds(0)), 64);
  float dk[C::D / 2], dv[C::D / 2];
#pragma unroll
  for (int i = 0; i < C::D / 2; ++i) dk[i] = dv[i] = 0.f;
  const float scale_log2 = a.scale * LOG2E;

  // One CTA barrier per tile, at its start, once its loads landed (and were fenced for wgmma's async proxy):
  // every warpgroup is then past the previous tile, so the other ring slot (refilled by the prefetch right after it)
  // and the dS^T tiles are free. One more between the dS^T stores and dQ's wgmmas, which read every warpgroup's.
  const int m_first = m_begin * C::BM, m_end = (m_begin + n_m) * C::BM;
  QueryTile qt = query_tile(0, hk, a.h_per_kv, m_begin, max(n_m, 1), C::BM);
  for (int it = 0; it < n_iters; ++it) {
    const QueryTile next = next_query_tile(qt, m_first, m_end, C::BM);
    const int st = C::STAGES == 2 ? it % 2 : 0;
    if constexpr (C::STAGES == 2) {
      cp_async_wait<0>();  // this tile's group (prefetched during the previous one, or before the loop)
    } else {
      __syncthreads();  // every warpgroup is past the previous tile: the one slot is free
      load_query_tile<C>(sm, a, b, qt, 0, sq_pad, true);
      cp_async_wait<0>();
    }
    fence_proxy_async();
    // DQ_BULK: the previous tile's bulk reductions have read their staging tiles (written again in this one).
    if constexpr (C::DQ_BULK) bulk_wait_read<0>();
    __syncthreads();
    if constexpr (C::STAGES == 2)
      load_query_tile<C>(sm, a, b, next, (it + 1) % 2, sq_pad, it + 1 < n_iters);

    const uint32_t q_s = smem_u32(sm.q(st)), do_s = smem_u32(sm.dout(st));
    // S^T and dP^T in two groups: P^T's exp2s run while dP^T is computed, dS^T while dV's wgmmas run.
    float s[C::BM / 2], dp[C::BM / 2];
    uint32_t pa[C::BM / 16][4], da[C::BM / 16][4];
    wgmma_fence();
    issue_scores<C>(s, kd, kmajor(q_s));
    wgmma_commit();
    issue_scores<C>(dp, vd, kmajor(do_s));
    wgmma_commit();
    const Cols<C> lse = Cols<C>::at(sm.lse(st));
    wgmma_wait<1>();
    fence_regs<C::BM / 2>(s);

    const int q_pos0 = qt.m0 + diag;
    const bool partial = C::Keys::partial(n0, C::BN, q_pos0, q_pos0 + C::BM - 1, a.sk);
    p_tile<C>(s, lse, partial, key0, q_pos0, a.sk, scale_log2);
    pack_a<C>(pa, s);
    wgmma_fence();
    issue_grad<C>(dv, pa, mnmajor(do_s, C::BM));
    wgmma_commit();
    const Cols<C> delta = Cols<C>::at(sm.delta(st));
    wgmma_wait<1>();  // dP^T (dV's wgmmas still in flight)
    fence_regs<C::BM / 2>(dp);
    ds_tile<C>(dp, s, delta);
    store_ds<C>(sm.ds(wg), dp, warp_wg, lane);
    pack_a<C>(da, dp);

    fence_proxy_async();  // dS^T's generic stores, before wgmma reads them
    named_sync(1, C::THREADS);  // every warpgroup's dS^T: dQ's blocks read all of them
    // dQ's first block, then dK's wgmmas, in flight while that block's reductions go out (tile_dq).
    tile_dq<C>(dsd, kd_mn, a.dq_accum + ((long long)b * a.heads + qt.h) * a.sq * C::D,
               sm.dq_stage(wg * (C::DQ_BLOCKS / C::NWG)), qt.m0, a.sq, wg, warp_wg, lane, [&] {
                 wgmma_fence();
                 issue_grad<C>(dk, da, mnmajor(q_s, C::BM));
                 wgmma_commit();
               });
    // dK and dV's wgmmas, which read this tile's Q and dO ring slot (the next tile's prefetch refills it). Waited
    // for here, not at the next tile's start: across the loop's back edge ptxas serialised every wgmma (C7515).
    wgmma_wait<0>();
    fence_regs<C::D / 2>(dk);
    fence_regs<C::D / 2>(dv);
    qt = next;
  }
  cp_async_wait<0>();
  if constexpr (C::DQ_BULK) bulk_wait<0>();  // the shared staging tiles stay valid until the reductions are done

  acc_to_global<C>(static_cast<T*>(a.dk) + b * a.dk_sb + hk * a.dk_sh, a.dk_ss, dk, a.scale, key0, a.sk);
  acc_to_global<C>(static_cast<T*>(a.dv) + b * a.dv_sb + hk * a.dv_sh, a.dv_ss, dv, 1.f, key0, a.sk);
}

}  // namespace fc

// The tuner appends, for one variant (tuner/kernels/render.py), the three entry points:
//   using TunerCfg = fc::BwdWgmmaConfig<...>;
//   extern "C" __global__ void __launch_bounds__(TunerCfg::THREADS, TunerCfg::MIN_BLOCKS) <name>(ATTN_BWD_PARAMS)
//   { ATTN_BWD_BODY(TunerCfg) }
//   extern "C" __global__ void __launch_bounds__(TunerCfg::AUX_THREADS) <name>_dot_do_o(ATTN_BWD_PARAMS) ...
#define ATTN_BWD_BODY(CFG) fc::attn_bwd_wgmma<CFG>(ATTN_BWD_ARGS);
#define ATTN_BWD_BODY_DOT_DO_O(CFG) fc::bwd_dot_do_o<CFG>(ATTN_BWD_ARGS);
#define ATTN_BWD_BODY_DQ_CONVERT(CFG) fc::bwd_dq_convert<CFG>(ATTN_BWD_ARGS);
