// One query tile against one consumer warpgroup's 64 keys, in the transposed frame (keys are wgmma's M):
//   S^T = K Q^T, dP^T = V dO^T        (SS: both K-major from the swizzled tiles)
//   P^T = exp2(S^T scale_log2 - lse_log2), dS^T = P^T (dP^T - delta)   (registers)
//   dV += P^T dO, dK += dS^T Q        (RS: P^T and dS^T from registers, dO and Q read MN-major)
//   dQ += dS K                        (SS: every warpgroup's dS^T stored to shared memory, read MN-major as A; K
//                                      read MN-major as B; the CTA's 64 x 64 blocks shared by the warpgroups,
//                                      added to dq_accum with fp32 vector reductions)
//   BLOCK_M 80 (DQ_T): dQ^T = K^T dS^T     (SS: K read MN-major as A, M = the warpgroup's 64 of D; dS stored
//                                      queries x keys by stmatrix.trans, read K-major as B, N = the 80 queries)
// Accumulator element e of a 64 x N wgmma tile held by a thread: 8-column block e / 4, row half (e / 2) % 2
// (+8 rows), column pair e % 2; rows warp * 16 + lane / 4 (warp within the warpgroup), columns 2 (lane % 4).
#pragma once

#include <stdint.h>

#include <type_traits>

#include "../attn_fwd_wgmma/wgmma_generated.h"
#include "../common/ptx_sm90.h"
#include "../common/utils.h"
#include "smem.h"

namespace fc {

// K-major descriptor (rows of the operand's M or N, the head dim along K) and MN-major one (rows along K), both
// of a swizzled tile of `rows` rows (its column blocks `rows` x 128 bytes apart).
__device__ __forceinline__ uint64_t kmajor(uint32_t addr) { return make_desc<128>(addr, 16, 1024); }
__device__ __forceinline__ uint64_t mnmajor(uint32_t addr, int rows) { return make_desc<128>(addr, rows * 128, 1024); }

// S^T (or dP^T) of the tile: D / 16 steps along the head dim. `kd`: K-major descriptor of the warpgroup's K (or V)
// rows (in tiles of BN rows); `qd`: of the stage's Q (or dO) tile (BM rows).
template <class C>
__device__ __forceinline__ void issue_scores(float* s, uint64_t kd, uint64_t qd) {
#pragma unroll
  for (int kk = 0; kk < C::D / 16; ++kk) {
    const uint32_t cb = kk / 4, off = (kk % 4) * 32;  // column block, bytes into its 128-byte row
    Wgmma<C::BM>::template ss<C::BF16, 0>(s, desc_advance<!C::WG_BROADCAST>(kd, cb * C::BN * 128 + off),
                                          desc_advance(qd, cb * C::BM * 128 + off), kk > 0);
  }
}

// The thread's query columns' values of a per-column tile vector (lse_log2 or delta): columns 2t, 2t + 1 of each 8.
// BM 64: read into registers when made (before the wgmma wait whose result they meet, so the loads' latency hides
// under it); BM 128: read from shared memory where used (32 more registers spilled).
template <class C>
struct RegCols {
  float2 v[C::BM / 8];
  __device__ __forceinline__ static RegCols at(const float* values) {
    RegCols c;
#pragma unroll
    for (int nb = 0; nb < C::BM / 8; ++nb) c.v[nb] = *reinterpret_cast<const float2*>(values + nb * 8 + 2 * (threadIdx.x % 4));
    return c;
  }
  __device__ __forceinline__ float2 operator[](int nb) const { return v[nb]; }
};
struct SmemCols {
  const float* p;
  __device__ __forceinline__ static SmemCols at(const float* values) { return SmemCols{values + 2 * (threadIdx.x % 4)}; }
  __device__ __forceinline__ float2 operator[](int nb) const { return *reinterpret_cast<const float2*>(p + nb * 8); }
};
// BLOCK_M 80 reads delta from shared memory too, and lse partly (LseCols): their 20 registers each, or lse's alone,
// spilled beside S^T, dP^T, dK and dV.
template <class C>
using Cols = std::conditional_t<C::BM == 64, RegCols<C>, SmemCols>;
// BLOCK_M 80's lse: its first N 8-query blocks read into registers when made (before the S^T wait, whose first
// exp2s need them: read after it, the loads queue behind dP^T's shared-memory reads), the rest where used.
template <int N>
struct PartCols {
  float2 v[N];
  const float* p;
  __device__ __forceinline__ static PartCols at(const float* values) {
    PartCols c;
    c.p = values + 2 * (threadIdx.x % 4);
#pragma unroll
    for (int nb = 0; nb < N; ++nb) c.v[nb] = *reinterpret_cast<const float2*>(c.p + nb * 8);
    return c;
  }
  __device__ __forceinline__ float2 operator[](int nb) const {
    return nb < N ? v[nb] : *reinterpret_cast<const float2*>(p + nb * 8);
  }
};
template <class C>
using LseCols = std::conditional_t<C::DQ_T, PartCols<C::LSE_REGS>, Cols<C>>;

// S^T -> P^T in place. key0: the thread's first key (row g of its warp's 16); q_pos0: the key-aligned position of
// query column 0; lse: the thread's columns' lse_log2 (load_cols; +inf past Sq or for a row that sees no key: P = 0).
// A partial tile's hidden scores are set to -inf first. The consumer runs partial and whole tiles in
// loops of their own (masked_rows_end): tested inside the exp2 loop, ptxas predicated the 64 compares onto every
// tile (ncu, causal: ~250 instructions a tile); in a branch of one loop, the test and its bounds still ran on all.
// Which tiles a loop of the consumer masks: none, all, or those Keys::partial names (a runtime test, one loop).
enum class Masking { WHOLE, PARTIAL, TEST };

template <class C, Masking MASK, class L>
__device__ __forceinline__ void p_tile(float* s, const L& lse, int n0, int key0, int q_pos0, int sk,
                                       float scale_log2) {
  const int t = threadIdx.x % 4;
  if (MASK == Masking::PARTIAL ||
      (MASK == Masking::TEST && C::Keys::partial(n0, C::BN, q_pos0, q_pos0 + C::BM - 1, sk))) {
#pragma unroll
    for (int nb = 0; nb < C::BM / 8; ++nb)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (C::Keys::hidden(key0 + (i / 2) * 8, q_pos0 + nb * 8 + 2 * t + i % 2, sk)) s[nb * 4 + i] = -INFINITY;
  }
#pragma unroll
  for (int nb = 0; nb < C::BM / 8; ++nb) {
    const float2 l = lse[nb];
#pragma unroll
    for (int i = 0; i < 4; ++i) s[nb * 4 + i] = fast_exp2(fmaf(s[nb * 4 + i], scale_log2, -(i % 2 ? l.y : l.x)));
  }
}

// dP^T -> dS^T = P^T (dP^T - delta) in place; delta: the thread's columns' (load_cols). dS is the gradient of the
// raw scores (the softmax scale is applied to dK at the end and to dQ by the conversion kernel).
template <class C>
__device__ __forceinline__ void ds_tile(float* dp, const float* p, const Cols<C>& delta) {
#pragma unroll
  for (int nb = 0; nb < C::BM / 8; ++nb) {
    const float2 d = delta[nb];
#pragma unroll
    for (int i = 0; i < 4; ++i) dp[nb * 4 + i] = p[nb * 4 + i] * (dp[nb * 4 + i] - (i % 2 ? d.y : d.x));
  }
}

// The thread's dS^T values as A fragments (pack_a's registers) into the warpgroup's dS^T tile (64 key rows of BM
// queries, swizzled):
// one stmatrix.x4 per 16 columns, whose four 8 x 8 matrices are the fragment's registers in order (rows 0-7 and
// 8-15 of the warp's 16, columns 16kk .. 16kk + 7, then 16kk + 8 ..); lane l addresses row l % 8 of matrix l / 8.
// (A 32-bit store per register pair made 16 stores and their swizzled addresses a tile.) BLOCK_M 128 keeps those
// stores: with stmatrix its causal tile with bulk reductions spilled.
// DQ_T (BLOCK_M 80): stored transposed (stmatrix.trans), queries x keys: the warpgroup's tile is its 64-key column
// block of the 80-row dS tile; matrix l / 8 of k-step kk is queries 16kk + 8 ((l / 8) / 2) .. + 7 (its rows in
// memory) by keys 8 ((l / 8) % 2) .. + 7 of the warp's 16.
// store_ds_offset: the thread's first stmatrix address in its warpgroup's dS^T tile less the tile's (BLOCK_M 64 and
// DQ_T; 0 at BLOCK_M 128, whose stores make their own), held across the loop (RingBase::ds_st); store_ds takes it
// plus the tile's (`addr`), or the tile itself (`tile`, BLOCK_M 128).
template <class C>
__device__ __forceinline__ uint32_t store_ds_offset(int warp_wg, int lane) {
  if constexpr (C::DQ_T) {
    const int m = lane / 8;
    return sw128_offset(8 * (m / 2) + lane % 8, 2 * warp_wg + m % 2, C::BM);
  } else if constexpr (C::BM == 64) {
    return sw128_offset(warp_wg * 16 + lane % 8 + 8 * ((lane / 8) % 2), lane / 16, 64);
  }
  return 0;
}

template <class C>
__device__ __forceinline__ void store_ds(uint8_t* tile, uint32_t addr, const float* ds, int warp_wg, int lane) {
  using T = typename C::T;
  if constexpr (C::DQ_T) {
    // k-step kk: queries 16kk on, 16 rows of 128 bytes further (16kk + q keeps q's row within its 8-row swizzle).
#pragma unroll
    for (int kk = 0; kk < C::BM / 16; ++kk) {
      const float* x = ds + 8 * kk;
      stmatrix_x4_trans(addr + store_ds_offset<C>(warp_wg, lane) + kk * 16 * 128, pack2<T>(x[0], x[1]),
                        pack2<T>(x[2], x[3]), pack2<T>(x[4], x[5]), pack2<T>(x[6], x[7]));
    }
  } else if constexpr (C::BM == 64) {
    // k-step kk: chunk 2kk + hi of the row, whose swizzled index is the first's XOR 2kk (the tile 1024-aligned).
#pragma unroll
    for (int kk = 0; kk < C::BM / 16; ++kk) {
      const float* x = ds + 8 * kk;  // pack_a's registers of k-step kk
      stmatrix_x4(addr ^ (kk << 5), pack2<T>(x[0], x[1]), pack2<T>(x[2], x[3]), pack2<T>(x[4], x[5]),
                  pack2<T>(x[6], x[7]));
    }
  } else {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int nb = 0; nb < C::BM / 8; ++nb)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        *reinterpret_cast<uint32_t*>(tile + sw128_offset(warp_wg * 16 + g + 8 * h, nb, 64) + 4 * t) =
            pack2<T>(ds[nb * 4 + 2 * h], ds[nb * 4 + 2 * h + 1]);
  }
}

// A fragments of P^T or dS^T (rounded to T) from the accumulators, as the forward packs P: k-step kk of the
// product is columns 16kk .. 16kk + 15 of the tile.
template <class C>
__device__ __forceinline__ void pack_a(uint32_t (*a)[4], const float* x) {
#pragma unroll
  for (int kk = 0; kk < C::BM / 16; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) a[kk][r] = pack2<typename C::T>(x[8 * kk + 2 * r], x[8 * kk + 2 * r + 1]);
}

// dV += P^T dO (or dK += dS^T Q), BM / 16 steps along the queries; `a`: P^T's (dS^T's) A fragments; `dod`:
// MN-major descriptor of the stage's dO (Q) tile.
template <class C>
__device__ __forceinline__ void issue_grad(float* acc, const uint32_t (*a)[4], uint64_t dod) {
#pragma unroll
  for (int kk = 0; kk < C::BM / 16; ++kk) Wgmma<C::D>::template rs<C::BF16>(acc, a[kk], desc_advance(dod, kk * 16 * 128), 1);
}

// Two floats to shared memory at a shared-window address.
__device__ __forceinline__ void sts_f2(uint32_t addr, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
}

// The thread's accumulators of a 64 x 64 dQ block into a staging tile (DQS_STRIDE floats a row). DQ_TILED: dq_index's
// swizzle, 8-column group nb of row r at nb ^ (r % 8) (r % 8 = g): the byte address of group nb is group 0's XOR
// 32 nb (rows 256 bytes, the tile 256-aligned), one LOP3 each, no address per store made from the row and column.
template <class C>
__device__ __forceinline__ void stage_block(float* stage, const float* acc, int warp_wg, int g, int t) {
  if constexpr (C::DQ_TILED) {
    static_assert(C::DQS_STRIDE == 64 && C::OFF_DQS % 256 == 0 && C::DQS_BYTES % 256 == 0, "256-byte rows, aligned");
    const uint32_t first = smem_u32(stage) + (warp_wg * 16 + g) * 256 + g * 32 + t * 8;
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) {
      const uint32_t at = first ^ (nb << 5);
#pragma unroll
      for (int h = 0; h < 2; ++h) sts_f2(at + h * 8 * 256, acc[nb * 4 + 2 * h], acc[nb * 4 + 2 * h + 1]);
    }
  } else {
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int nb = 0; nb < 8; ++nb)
        *reinterpret_cast<float2*>(stage + (warp_wg * 16 + g + 8 * h) * C::DQS_STRIDE + nb * 8 + 2 * t) =
            make_float2(acc[nb * 4 + 2 * h], acc[nb * 4 + 2 * h + 1]);
  }
}

// DQ_T: the thread's dQ^T accumulators (a warpgroup's 64 columns of D x 80 queries) into its staging tile, line d
// (a column of dQ) of 80 floats, dq_index's swizzle of the 8-query groups ((d / 2) % 2 = (g / 2) % 2): group nb at
// nb ^ sw, i.e. 8 floats right of nb for an even nb and left for an odd one where sw is 1, so two addresses (even
// and odd groups) and immediates serve all 40 stores. (Made per store, ptxas hoisted them out of the loop: spilled.)
template <class C>
__device__ __forceinline__ void stage_block_t(float* stage, const float* acc, int warp_wg, int g, int t) {
  const int sw = (g / 2) % 2;
  const uint32_t line = smem_u32(stage) + ((warp_wg * 16 + g) * C::DQS_STRIDE + 2 * t) * 4;
  const uint32_t even = line + sw * 32, odd = line - sw * 32;
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int nb = 0; nb < C::BM / 8; ++nb)
      sts_f2((nb % 2 ? odd : even) + (h * 8 * C::DQS_STRIDE + nb * 8) * 4, acc[nb * 4 + 2 * h],
             acc[nb * 4 + 2 * h + 1]);
}

// DQ_T: the warpgroup's dQ^T block (its 64 columns of D x the tile's 80 queries) = K^T dS^T over the CTA's BN keys,
// A = the K tile read MN-major (`kd`: column block wg), B = the dS tile (queries x keys, K-major: `dsd`, a 64-key
// column block DS_BYTES after the other), staged for the writer warp (a bulk reduction per half). As tile_dq:
// `after_first` (dK's wgmmas) issued behind it, so that they run while the block is staged.
template <class C, class AfterFirst>
__device__ __forceinline__ void tile_dq_t(uint64_t dsd, uint64_t kd, float* stage, int wg, int warp_wg, int lane,
                                          AfterFirst&& after_first) {
  float acc[C::BM / 2];
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < C::BN / 16; ++kk)
    Wgmma<C::BM>::template ss<C::BF16, 0, 1>(acc, desc_advance(kd, wg * C::BN * 128 + kk * 16 * 128),
                                             desc_advance(dsd, (kk / 4) * C::DS_BYTES + (kk % 4) * 32), kk > 0);
  wgmma_commit();
  after_first();
  wgmma_wait<1>();
  fence_regs<C::BM / 2>(acc);
  // The warp's D lines lie in one half of the block (DQ_HALVES): the writer has read what that half last held.
  const int half = __shfl_sync(0xffffffff, warp_wg, 0) / 2;
  named_sync(C::dq_free(wg, half), C::DQ_SYNC);
  stage_block_t<C>(stage, acc, warp_wg, lane / 4, lane % 4);
  fence_proxy_async();  // the generic stores, before the writer's bulk copy reads them
  named_arrive(C::dq_full(wg, half), C::DQ_SYNC);
}

// Warpgroup wg's first dQ block (block wg): its query half (x) and column block (y), where the descriptors tile_dq
// takes point already (made once: made from wg, ptxas made the offsets of each wgmma step from the warpgroup index
// every tile). DQ_T: (0, 0) (tile_dq_t's offsets from wg: pointing at its 64 of D, its loop was 9 longer).
template <class C>
__device__ __forceinline__ int2 dq_first_block(int wg) {
  // Every block's column block at or right of the first's (desc_advance adds unsigned bytes): c = (i NWG + wg) % (D
  // / 64) is wg % (D / 64) for each i where D / 64 divides NWG, and wg is 0 where NWG is 1.
  static_assert(C::NWG == 1 || C::NWG % (C::D / 64) == 0, "dQ blocks' column offsets from the first non-negative");
  if constexpr (C::DQ_T) return make_int2(0, 0);
  return make_int2(wg / (C::D / 64), wg % (C::D / 64));
}

// A 64 x 64 dQ block (`acc`, `rows` of them in the problem) added to dq_accum at `dst` (its first row) by the TMA
// unit: the accumulators staged in shared memory (`stage`, DQS_STRIDE floats a row), then one bulk reduction of 64
// fp32 per row, issued by one lane per warp for its 16 rows. The staging tile is written again only after the
// issuing lanes' bulk_wait_read (in the next tile, before its dS^T barrier).
template <class C>
__device__ __forceinline__ void reduce_block_bulk(float* dst, float* stage, const float* acc, int rows, int wg,
                                                  int warp_wg, int g, int t) {
  stage_block<C>(stage, acc, warp_wg, g, t);
  fence_proxy_async();  // the generic stores, before the bulk copy reads them
  named_sync(2 + wg, 128);
  // One lane per warp issues the warp's 16 rows, from warp-uniform addresses (the warp index broadcast, so ptxas
  // can prove it): per-lane addresses made ptxas loop over the lanes to move each to the uniform datapath.
  const int w = __shfl_sync(0xffffffff, warp_wg, 0);
  if (elect_one()) {
#pragma unroll
    for (int i = 0; i < 16; ++i)
      if (w * 16 + i < rows) bulk_reduce_add_f32(dst + (w * 16 + i) * C::D, stage + (w * 16 + i) * C::DQS_STRIDE, 256);
    bulk_commit();
  }
}

// dQ[m0 .., :] += dS K over the CTA's BN keys, in 64 x 64 blocks (query half mh, column block c) shared by the
// warpgroups: block i * NWG + wg is this warpgroup's i-th (DQ_BLOCKS % NWG == 0, the manifest's constraint), so
// each (query row, column) of a tile is reduced into dq_accum once per CTA, not once per warpgroup. A from the
// warpgroups' dS^T tiles MN-major (`dsd`: warpgroup w's 64 keys DS_BYTES after w - 1's), B from the K tile
// MN-major (`kd`, column blocks BN rows apart; dsd and kd point at block wg's, dq_first_block); dq_rows: the
// (batch, head)'s dq_accum rows, added to with vector reductions (DQ_BULK: through `stage`, the warpgroup's first
// staging tile; DQ_WRITER: staged there for the producer's writer warp, which hands the tiles back on dq_free;
// `buf`: the tile's set of staging tiles). `after_first`: issued right after the first block's wgmmas (dK's), so
// that they run while that block's reductions go out: the first block waits with one group still in flight, the
// later ones for all.
template <class C, class AfterFirst>
__device__ __forceinline__ void tile_dq(uint64_t dsd, uint64_t kd, float* dq_rows, float* stage, int buf, int m0,
                                        int sq, int wg, int warp_wg, int lane, AfterFirst&& after_first) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int i = 0; i < C::DQ_BLOCKS / C::NWG; ++i) {
    const int blk = i * C::NWG + wg, mh = blk / (C::D / 64), c = blk % (C::D / 64);
    const int2 first = dq_first_block<C>(wg);  // where dsd and kd point (0 for block 0)
    float acc[32];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < C::BN / 16; ++kk)
      Wgmma<64>::template ss<C::BF16, 1, 1>(
          acc, desc_advance(dsd, (kk / 4) * C::DS_BYTES + (mh - first.x) * 64 * 128 + (kk % 4) * 16 * 128),
          desc_advance(kd, (c - first.y) * C::BN * 128 + kk * 16 * 128), kk > 0);
    wgmma_commit();
    if (i == 0) {
      after_first();
      wgmma_wait<1>();
    } else {
      wgmma_wait<0>();
    }
    fence_regs<32>(acc);
    float* dst = dq_rows + (long long)(m0 + mh * 64) * C::D + c * 64;  // the block's first row
    if constexpr (C::DQ_WRITER) {
      if (i == 0) named_sync(C::dq_free(wg, buf), C::DQ_SYNC);  // the writer has read what this set last held
      stage_block<C>(stage + i * C::DQS_BYTES / 4, acc, warp_wg, g, t);
      if constexpr (C::DQ_TILED) fence_proxy_async();  // the generic stores, before the writer's bulk copy reads them
      if (i == C::DQ_BLOCKS / C::NWG - 1) named_arrive(C::dq_full(wg, buf), C::DQ_SYNC);
    } else if constexpr (C::DQ_BULK) {
      reduce_block_bulk<C>(dst, stage + i * C::DQS_BYTES / 4, acc, sq - (m0 + mh * 64), wg, warp_wg, g, t);
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = warp_wg * 16 + g + 8 * h;
        if (m0 + mh * 64 + r >= sq) continue;
#pragma unroll
        for (int nb = 0; nb < 8; ++nb)
          red_add_v2(dst + r * C::D + nb * 8 + 2 * t, acc[nb * 4 + 2 * h], acc[nb * 4 + 2 * h + 1]);
      }
    }
  }
}

}  // namespace fc
