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

// A descriptor made once for the loop (KeyBlock, RingBase): through `opaque` (ptx_sm90.h) where the warpgroup index
// is warp-uniform (WG_BROADCAST), so ptxas holds it in uniform registers without knowing its low bits clear (it
// turned the first steps' advances into ORs that split the pair, a UMOV of the high word each); else as made
// (BLOCK_M 128: per-thread values, for ptxas to make again; held, they spilled).
template <class C>
__device__ __forceinline__ uint64_t held(uint64_t d) {
  return C::WG_BROADCAST ? opaque(d) : d;
}

// What a consumer warpgroup keeps for its whole loop: its shared-memory descriptors and its keys.
struct KeyBlock {
  uint64_t kd, vd;     // its 64 K and V rows, K-major (S^T = K Q^T, dP^T = V dO^T)
  uint64_t kd_mn;      // the K tile, MN-major (dQ = dS K), at this warpgroup's first dQ block's column block
                       // (dq_first_block)
  int n0, key0;        // the CTA's first key; this thread's first key (and key0 + 8)
  int cw;              // consumer warpgroup
};

template <class C>
__device__ __forceinline__ KeyBlock key_block(const WgSmem<C>& sm, int n0, int cw) {
  const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
  const uint32_t k_rows = smem_u32(sm.k()) + cw * 64 * 128, v_rows = smem_u32(sm.v()) + cw * 64 * 128;
  const uint32_t k_dq = smem_u32(sm.k()) + dq_first_block<C>(cw).y * C::BN * 128;
  return KeyBlock{held<C>(kmajor(k_rows)), held<C>(kmajor(v_rows)), held<C>(mnmajor(k_dq, C::BN)), n0,
                  n0 + cw * 64 + warp * 16 + lane / 4, cw};
}

// Ring slot 0's and dS^T set 0's descriptors and addresses, made once before the loop: a tile's are these plus its
// slot's (set's) offset, one add each. (Made from the slot's address in the loop they cost ~45 uniform
// instructions a tile: the shared window's base, each descriptor's mask and shift, ORs and high-word moves.)
template <class C>
struct RingBase {
  uint64_t q, dout;  // slot 0's Q and dO tiles, K-major
  uint64_t ds;       // set 0's dS^T tiles as dQ's operand (DQ_T: B, K-major; else A, MN-major, at the query rows
                     // of this warpgroup's first dQ block)
  uint32_t ds_st;    // set 0: this thread's first stmatrix address in its warpgroup's dS^T tile (store_ds; DQ_T:
                     // the tile's, the thread's offset made in the tile)
  // K-major -> MN-major over the tile's BM rows: the leading byte offset field (bits 16-29) from 16 to BM * 128.
  static constexpr uint64_t MN = (uint64_t)(C::BM * 128 / 16 - 1) << 16;
  static constexpr uint32_t SET = C::NWG * C::DS_BYTES;  // bytes from one dS^T set to the next

  // BLOCK_M 128 (no WG_BROADCAST, 255 registers): made from the slot's address in the tile, as before RingBase (from
  // slot 0's descriptor, 5 of its 18 variants spilled 8-48 bytes).
  uint32_t q_s, dout_s, ds_s;

  __device__ __forceinline__ uint64_t q_at(int st) const {
    if constexpr (!C::WG_BROADCAST) return kmajor(q_s + st * C::Q_BYTES);
    return q + (uint32_t)st * (C::Q_BYTES / 16);
  }
  __device__ __forceinline__ uint64_t dout_at(int st) const {
    if constexpr (!C::WG_BROADCAST) return kmajor(dout_s + st * C::Q_BYTES);
    return dout + (uint32_t)st * (C::Q_BYTES / 16);
  }
  // Q's or dO's descriptor MN-major over the tile's BM rows (`kd`: q_at's or dout_at's of slot st).
  __device__ __forceinline__ uint64_t mn(uint64_t kd, uint32_t base, int st) const {
    if constexpr (!C::WG_BROADCAST) return mnmajor(base + st * C::Q_BYTES, C::BM);
    return kd + MN;
  }
  __device__ __forceinline__ uint64_t ds_at(int set) const {
    if constexpr (!C::WG_BROADCAST) return C::DQ_T ? kmajor(ds_s + set * SET) : mnmajor(ds_s + set * SET, 64);
    return ds + (uint32_t)set * (SET / 16);
  }
  __device__ __forceinline__ uint32_t ds_st_at(int set) const { return ds_st + (uint32_t)set * SET; }
};

template <class C>
__device__ __forceinline__ RingBase<C> ring_base(const WgSmem<C>& sm, int cw) {
  const uint32_t ds = smem_u32(sm.ds(0));
  const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
  return RingBase<C>{held<C>(kmajor(smem_u32(sm.q(0)))), held<C>(kmajor(smem_u32(sm.dout(0)))),
                     held<C>(C::DQ_T ? kmajor(ds) : mnmajor(ds + dq_first_block<C>(cw).x * 64 * 128, 64)),
                     ds + cw * C::DS_BYTES + (C::DQ_T ? 0u : store_ds_offset<C>(warp, lane)), smem_u32(sm.q(0)),
                     smem_u32(sm.dout(0)), ds + dq_first_block<C>(cw).x * 64 * 128};
}

// Query tile qt (its Q, dO, lse and delta in ring slot st, landed and visible to wgmma) against the warpgroup's keys:
// dK and dV accumulate in registers, dQ's blocks go to dq_accum. `set`: the set of dS^T tiles this tile writes
// (every warpgroup's, DS_BYTES apart); `dq_buf`: its set of dQ staging tiles (< DQ_BUFS). Returns with every wgmma
// of the tile complete (its ring slot may be refilled). MASK: whether the tile is partial (Keys::partial).
template <class C, Masking MASK>
__device__ __forceinline__ void consume_tile(const WgSmem<C>& sm, const BwdArgs& a, const KeyBlock& kb,
                                             const RingBase<C>& rb, int b, QueryTile qt, int st, int set, int dq_buf,
                                             float scale_log2, float* dk, float* dv) {
  const uint64_t qd = rb.q_at(st), dod = rb.dout_at(st);
  const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
  // S^T and dP^T in two groups: P^T's exp2s run while dP^T is computed, dS^T while dV's wgmmas run.
  float s[C::BM / 2], dp[C::BM / 2];
  uint32_t pa[C::BM / 16][4], da[C::BM / 16][4];
  // lse read before the wgmmas are issued: read after them, its loads return behind their shared-memory reads
  // (ncu: 10% of the consumers' samples waited for them). Not where that spills (LSE_FIRST).
  LseCols<C> lse;
  if constexpr (C::LSE_FIRST) lse = LseCols<C>::at(sm.lse(st));
  wgmma_fence();
  issue_scores<C>(s, kb.kd, qd);
  wgmma_commit();
  issue_scores<C>(dp, kb.vd, dod);
  wgmma_commit();
  if constexpr (!C::LSE_FIRST) lse = LseCols<C>::at(sm.lse(st));
  wgmma_wait<1>();
  fence_regs<C::BM / 2>(s);

  // Only tiles that may be partial make the query positions.
  p_tile<C, MASK>(s, lse, kb.n0, kb.key0, MASK != Masking::WHOLE ? qt.m0 + a.sk - a.sq : 0, a.sk, scale_log2);
  if constexpr (C::DQ_T) {
    // BLOCK_M 80: dS^T before P^T is packed and dV's wgmmas issued (FlashAttention-3's order), so that P^T's fp32
    // values and their A fragments are never live together (S^T, dP^T, dK and dV hold 208 registers; both spilled).
    const Cols<C> delta = Cols<C>::at(sm.delta(st));
    wgmma_wait<0>();  // dP^T
    fence_regs<C::BM / 2>(dp);
    ds_tile<C>(dp, s, delta);
    pack_a<C>(pa, s);
    wgmma_fence();
    issue_grad<C>(dv, pa, rb.mn(dod, rb.dout_s, st));
    wgmma_commit();
  } else {
    pack_a<C>(pa, s);
    const Cols<C> delta = Cols<C>::at(sm.delta(st));  // before dV's wgmmas, for the same reason
    wgmma_fence();
    issue_grad<C>(dv, pa, rb.mn(dod, rb.dout_s, st));
    wgmma_commit();
    wgmma_wait<1>();  // dP^T (dV's wgmmas still in flight)
    fence_regs<C::BM / 2>(dp);
    ds_tile<C>(dp, s, delta);
  }
  store_ds<C>(sm.ds(set * C::NWG + kb.cw), rb.ds_st_at(set), dp, warp, lane);
  pack_a<C>(da, dp);

  // DQ_BULK: the previous tile's bulk reductions have read this warpgroup's staging tiles (written again below,
  // after the barrier).
  if constexpr (C::CONSUMER_BULK) bulk_wait_read<0>();
  fence_proxy_async();  // dS^T's generic stores, before wgmma reads them
  named_sync(1, C::NWG * 128);  // every warpgroup's dS^T: dQ's blocks read all of them
  // dQ's first block, then dK's wgmmas, in flight while that block's reductions go out (tile_dq).
  const auto issue_dk = [&] {
    wgmma_fence();
    issue_grad<C>(dk, da, rb.mn(qd, rb.q_s, st));
    wgmma_commit();
  };
  if constexpr (C::DQ_T)
    tile_dq_t<C>(rb.ds_at(set), kb.kd_mn, sm.dq_stage(kb.cw), kb.cw, warp, lane, issue_dk);
  else
    tile_dq<C>(rb.ds_at(set), kb.kd_mn, a.dq_accum + ((long long)b * a.heads + qt.h) * a.sq * C::D,
               sm.dq_stage(kb.cw * (C::DQ_BLOCKS / C::NWG), dq_buf), dq_buf, qt.m0, a.sq, kb.cw, warp, lane, issue_dk);
  // dK and dV's wgmmas, which read this tile's Q and dO ring slot. Waited for here, not at the next tile's start:
  // across the loop's back edge ptxas serialised every wgmma (C7515).
  wgmma_wait<0>();
  fence_regs<C::D / 2>(dk);
  fence_regs<C::D / 2>(dv);
}

}  // namespace fc
