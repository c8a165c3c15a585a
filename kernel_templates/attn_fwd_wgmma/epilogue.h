// A consumer warpgroup's epilogue for one work item: O / l and the log-sum-exp
// of its 64 rows to global memory, then its Q rows handed back to the producer.
#pragma once

#include <stdint.h>

#include "../common/attn_args.h"
#include "../common/utils.h"
#include "config.h"
#include "../common/ptx_sm90.h"
#include "tile_scheduler.h"

namespace fc {

// O / l is staged in this warpgroup's own Q rows (free once its last Q K^T
// has completed), then written as whole 16-byte chunks per row. Chunks are
// XOR-swizzled by row inside each SWB-byte row, so neither the 4-byte
// fragment stores nor the 16-byte reads conflict on banks.
//
// qk_scale is the scores' scale (FP8: descales included); an FP8 V's descale multiplies O here.
template <class C>
__device__ __forceinline__ void epilogue(const float* o, bool empty, const float (&row_max)[2], const float (&row_sum)[2],
                                         float qk_scale, const SmemLayout<C>& sm, const AttnArgs& a, const Work& it,
                                         int cw, int tid, int warp, int lane, int row0) {
  using T = typename C::TO;
  constexpr int EO = C::SWB / 2;    // output elements per swizzled row (16-bit)
  constexpr int CPR = C::SWB / 16;  // 16-byte chunks per row of a column block
  uint8_t* stage = sm.raw_ptr + (sm.sQ - sm.raw);
  float v_scale = 1.f;
  if constexpr (C::FP8) v_scale = a.v_descale[it.b * (a.heads / a.h_per_kv) + it.h / a.h_per_kv];
  // r: row within this warpgroup's 64; col: multiple of 8. Unsigned: a signed % or / costs a sign fix-up.
  auto chunk_offset = [&](uint32_t r, uint32_t col) {
    const uint32_t cb = col / EO, chunk = (col % EO) / 8;
    return cb * C::BM * C::SWB + (cw * 64 + r) * C::SWB + ((chunk ^ (r % CPR)) * 16);
  };
  const int sq = item_sq<C>(a, it), q_row = q_row_of<C>(it);
  named_sync(4 + cw, 128);  // every warp of this warpgroup is past its last wgmma
  float l[2], inv[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] = row_sum[i];
    l[i] += __shfl_xor_sync(0xffffffff, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffff, l[i], 2);
    // The approximate reciprocal and log (MUFU): 1-2 ulp, far below the output's 16-bit rounding, where the
    // IEEE division and logf cost ~40 instructions a row and a branch to a slow path. Flushing denormals: a
    // row's l is 0 or >= 1 (its max term is exp2(0), FP8 2^P_SHIFT).
    inv[i] = l[i] > 0.f ? v_scale * fast_rcp(l[i]) : 0.f;
  }
  // stmatrix: lane l addresses row l % 8 of tile l / 8; tiles 0, 1 are rows +0 / +8 of column block nb,
  // tiles 2, 3 the same rows of block nb + 1. One instruction stores what four 4-byte stores did. nb is even,
  // so chunk (nb % CPR) + t swizzled is (nb % CPR) ^ (t ^ row % CPR): CPR / 2 lane addresses, the column
  // block an immediate offset (as chunk_offset, unfolded).
  const uint32_t t = (lane / 8) / 2, st_row = warp * 16 + lane % 8 + 8 * ((lane / 8) % 2);
  const uint32_t row_base = sm.sQ + (cw * 64 + st_row) * C::SWB, y = t ^ (st_row % CPR);
  uint32_t st_addr[CPR / 2];
#pragma unroll
  for (int k = 0; k < CPR / 2; ++k) st_addr[k] = row_base + ((2 * k) ^ y) * 16;
  auto st = [&](int nb) { return st_addr[(nb % CPR) / 2] + (nb / CPR) * C::BM * C::SWB; };
  if (empty) {  // no key tile: O is zero (and o was never written)
#pragma unroll
    for (int nb = 0; nb < C::D / 8; nb += 2) stmatrix_x4(st(nb), 0, 0, 0, 0);
  } else {
#pragma unroll
    for (int nb = 0; nb < C::D / 8; nb += 2)
      stmatrix_x4(st(nb), pack2<T>(o[nb * 4] * inv[0], o[nb * 4 + 1] * inv[0]),
                  pack2<T>(o[nb * 4 + 2] * inv[1], o[nb * 4 + 3] * inv[1]),
                  pack2<T>(o[nb * 4 + 4] * inv[0], o[nb * 4 + 5] * inv[0]),
                  pack2<T>(o[nb * 4 + 6] * inv[1], o[nb * 4 + 7] * inv[1]));
  }
  // Packed: the sequence's lse row, [H, total] at (h, q_row), made once (per row, the first row's store, which
  // may alias cu_q, made the second reload total = cu_q[batch] and redo the 64-bit product).
  const long long packed_lse = C::PACKED && a.lse != nullptr ? (long long)it.h * a.cu_q[a.batch] + q_row : 0;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = row0 + 8 * i;
    if (a.lse != nullptr && lane % 4 == 0 && row < sq) {
      // [B, H, Sq]; packed, [H, total] (FlashAttention's varlen lse), total = cu_q[batch].
      const long long at = C::PACKED ? packed_lse + row
                                     : ((long long)it.b * a.heads + it.h) * a.sq + row;
      a.lse[at] = l[i] > 0.f ? row_max[i] * C::Cap::softmax_scale(qk_scale) + fast_log2(l[i]) * LN2 - C::P_SHIFT * LN2
                             : NEG_INF;
    }
  }
  named_sync(4 + cw, 128);
  T* out = reinterpret_cast<T*>(a.o) + tma_batch_of<C>(it) * a.o_sb + it.h * a.o_sh + q_row * a.o_ss;
  constexpr int ROW_CHUNKS = C::D / 8;  // 16-byte chunks per output row
  const int first_row = it.m0 + cw * 64;
  if constexpr (128 % ROW_CHUNKS == 0) {
    // Each thread keeps one column and walks rows RSTEP apart: its global address advances by a fixed
    // stride (one 64-bit add a chunk). Derived from a flat chunk index, each chunk cost ~45 instructions
    // of signed division and 64-bit address arithmetic (ncu, D128: 359 per warp and item).
    constexpr int RSTEP = 128 / ROW_CHUNKS;
    const uint32_t t = tid % 128, col = (t % ROW_CHUNKS) * 8, r0 = t / ROW_CHUNKS;
    T* dst = out + (long long)(first_row + r0) * a.o_ss + col;
    const long long step = RSTEP * a.o_ss;
    // Each row's bound one compare with an immediate, up to 8 rows a thread; at D256 (16) ptxas made that a
    // branch around each store (+48 static), so there the row index is compared.
    const int rows_left = sq - first_row - static_cast<int>(r0);
#pragma unroll
    for (int k = 0; k < 64 / RSTEP; ++k, dst += step) {
      const uint32_t r = r0 + k * RSTEP;
      const uint4 chunk = *reinterpret_cast<const uint4*>(stage + chunk_offset(r, col));  // in bounds for any row
      if (64 / RSTEP <= 8 ? k * RSTEP < rows_left : first_row + static_cast<int>(r) < sq)
        *reinterpret_cast<uint4*>(dst) = chunk;
    }
  } else {
    constexpr int CHUNKS = 64 * ROW_CHUNKS;
#pragma unroll
    for (int idx = tid % 128; idx < CHUNKS; idx += 128) {
      const int r = idx / ROW_CHUNKS, col = idx % ROW_CHUNKS * 8;
      const int row = first_row + r;
      if (row < sq)
        *reinterpret_cast<uint4*>(out + row * a.o_ss + col) =
            *reinterpret_cast<const uint4*>(stage + chunk_offset(r, col));
    }
  }
  // This warp has read its staged rows: sQ may be reloaded. The next Q is
  // written by TMA (the async proxy) over bytes these threads accessed
  // through the generic proxy, so fence, and gather the lanes, first.
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  if constexpr (TileScheduler<C>::WARP_WALK) {
    // Each thread read the item's mailbox too: an arrive releases only its own thread's accesses, so every
    // thread arrives (q_empty counts 128 here), or the loader's next post could race the lanes' reads.
    mbar_arrive(sm.q_empty(cw));
  } else {
    __syncwarp();
    if (lane == 0) mbar_arrive(sm.q_empty(cw));
  }
}

}  // namespace fc
