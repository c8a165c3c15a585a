// One query tile of a consumer warpgroup (both of the template's loops: all threads loading, or a producer
// warpgroup loading by TMA): S^T and dP^T, P^T and dS^T, dV and dK's wgmmas, this warpgroup's share of dQ.
#pragma once

#include <stdint.h>

#include "../attn_bwd_mma/args.h"
#include "../attn_bwd_mma/tile.h"
#include "../common/ptx_sm90.h"
#include "../common/utils.h"
#include "smem.h"
#include "tile.h"

namespace fc {

// What a consumer warpgroup keeps for its whole loop: its shared-memory descriptors and its keys.
struct KeyBlock {
  uint64_t kd, vd;     // its 64 K and V rows, K-major (S^T = K Q^T, dP^T = V dO^T)
  uint64_t kd_mn;      // the whole K tile, MN-major (dQ = dS K)
  int n0, key0;        // the CTA's first key; this thread's first key (and key0 + 8)
  int cw;              // consumer warpgroup
};

template <class C>
__device__ __forceinline__ KeyBlock key_block(const WgSmem<C>& sm, int n0, int cw) {
  const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
  const uint32_t k_rows = smem_u32(sm.k()) + cw * 64 * 128, v_rows = smem_u32(sm.v()) + cw * 64 * 128;
  return KeyBlock{kmajor(k_rows), kmajor(v_rows), mnmajor(smem_u32(sm.k()), C::BN), n0, n0 + cw * 64 + warp * 16 + lane / 4,
                  cw};
}

// Query tile qt (its Q, dO, lse and delta in ring slot st, landed and visible to wgmma) against the warpgroup's keys:
// dK and dV accumulate in registers, dQ's blocks go to dq_accum. `ds`: the dS^T tiles this tile writes (every
// warpgroup's, DS_BYTES apart); `dq_buf`: its set of dQ staging tiles (< DQ_BUFS). Returns with every wgmma of the tile complete (its ring slot may be refilled).
template <class C>
__device__ __forceinline__ void consume_tile(const WgSmem<C>& sm, const BwdArgs& a, const KeyBlock& kb, int b,
                                             QueryTile qt, int st, uint8_t* ds, int dq_buf, float scale_log2,
                                             float* dk, float* dv) {
  const uint32_t q_s = smem_u32(sm.q(st)), do_s = smem_u32(sm.dout(st));
  const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
  // S^T and dP^T in two groups: P^T's exp2s run while dP^T is computed, dS^T while dV's wgmmas run.
  float s[C::BM / 2], dp[C::BM / 2];
  uint32_t pa[C::BM / 16][4], da[C::BM / 16][4];
  // lse read before the wgmmas are issued: read after them, its loads return behind their shared-memory reads
  // (ncu: 10% of the consumers' samples waited for them). Not where that spills (LSE_FIRST).
  LseCols<C> lse;
  if constexpr (C::LSE_FIRST) lse = LseCols<C>::at(sm.lse(st));
  wgmma_fence();
  issue_scores<C>(s, kb.kd, kmajor(q_s));
  wgmma_commit();
  issue_scores<C>(dp, kb.vd, kmajor(do_s));
  wgmma_commit();
  if constexpr (!C::LSE_FIRST) lse = LseCols<C>::at(sm.lse(st));
  wgmma_wait<1>();
  fence_regs<C::BM / 2>(s);

  const int q_pos0 = qt.m0 + a.sk - a.sq;  // the tile's first query, aligned to the keys (bottom-right causal)
  const bool partial = C::Keys::partial(kb.n0, C::BN, q_pos0, q_pos0 + C::BM - 1, a.sk);
  p_tile<C>(s, lse, partial, kb.key0, q_pos0, a.sk, scale_log2);
  if constexpr (C::DQ_T) {
    // BLOCK_M 80: dS^T before P^T is packed and dV's wgmmas issued (FlashAttention-3's order), so that P^T's fp32
    // values and their A fragments are never live together (S^T, dP^T, dK and dV hold 208 registers; both spilled).
    const Cols<C> delta = Cols<C>::at(sm.delta(st));
    wgmma_wait<0>();  // dP^T
    fence_regs<C::BM / 2>(dp);
    ds_tile<C>(dp, s, delta);
    pack_a<C>(pa, s);
    wgmma_fence();
    issue_grad<C>(dv, pa, mnmajor(do_s, C::BM));
    wgmma_commit();
  } else {
    pack_a<C>(pa, s);
    const Cols<C> delta = Cols<C>::at(sm.delta(st));  // before dV's wgmmas, for the same reason
    wgmma_fence();
    issue_grad<C>(dv, pa, mnmajor(do_s, C::BM));
    wgmma_commit();
    wgmma_wait<1>();  // dP^T (dV's wgmmas still in flight)
    fence_regs<C::BM / 2>(dp);
    ds_tile<C>(dp, s, delta);
  }
  store_ds<C>(ds + kb.cw * C::DS_BYTES, dp, warp, lane);
  pack_a<C>(da, dp);

  // DQ_BULK: the previous tile's bulk reductions have read this warpgroup's staging tiles (written again below,
  // after the barrier).
  if constexpr (C::CONSUMER_BULK) bulk_wait_read<0>();
  fence_proxy_async();  // dS^T's generic stores, before wgmma reads them
  named_sync(1, C::NWG * 128);  // every warpgroup's dS^T: dQ's blocks read all of them
  // dQ's first block, then dK's wgmmas, in flight while that block's reductions go out (tile_dq).
  const auto issue_dk = [&] {
    wgmma_fence();
    issue_grad<C>(dk, da, mnmajor(q_s, C::BM));
    wgmma_commit();
  };
  if constexpr (C::DQ_T)
    tile_dq_t<C>(kmajor(smem_u32(ds)), kb.kd_mn, sm.dq_stage(kb.cw), kb.cw, warp, lane, issue_dk);
  else
    tile_dq<C>(mnmajor(smem_u32(ds), 64), kb.kd_mn, a.dq_accum + ((long long)b * a.heads + qt.h) * a.sq * C::D,
               sm.dq_stage(kb.cw * (C::DQ_BLOCKS / C::NWG), dq_buf), dq_buf, qt.m0, a.sq, kb.cw, warp, lane, issue_dk);
  // dK and dV's wgmmas, which read this tile's Q and dO ring slot. Waited for here, not at the next tile's start:
  // across the loop's back edge ptxas serialised every wgmma (C7515).
  wgmma_wait<0>();
  fence_regs<C::D / 2>(dk);
  fence_regs<C::D / 2>(dv);
}

}  // namespace fc
