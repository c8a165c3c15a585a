// Compile-time configuration of the decode template (one instantiation per
// variant; tuner/kernels/render.py writes its arguments).
#pragma once

#include "../attn_fwd_mma/config.h"

namespace fc {

template <typename T_, int HEAD_DIM_, int BLOCK_M_, int BLOCK_N_, int NUM_WARPS_, int SPLITS_, int STAGES_,
          Swizzle SWIZZLE_, bool CAUSAL_>
struct DecodeConfig {
  using T = T_;
  static constexpr int D = HEAD_DIM_;
  // Rows of the tile: (query position, query head of the GQA group) pairs, so
  // each K/V tile is read once for the whole group.
  static constexpr int BM = BLOCK_M_;
  static constexpr int BN = BLOCK_N_;
  static constexpr int NUM_WARPS = NUM_WARPS_;
  // CTAs of one thread-block cluster that split the keys; their partial
  // results are merged through distributed shared memory (no workspace).
  static constexpr int SPLITS = SPLITS_;
  static constexpr int STAGES = STAGES_;
  static constexpr Swizzle SWIZZLE = SWIZZLE_;
  static constexpr bool CAUSAL = CAUSAL_;
  static constexpr int MIN_BLOCKS = 1;

  static constexpr int THREADS = NUM_WARPS * 32;
  static constexpr int MT = BM / 16;                  // m16 tiles: every warp holds every row
  static constexpr int KEYS_PER_WARP = BN / NUM_WARPS;  // the warps split each K/V tile
  static constexpr int NT = KEYS_PER_WARP / 8;
  static constexpr int KD = D / 16;
  static constexpr int KN = KEYS_PER_WARP / 16;
  static constexpr int DT = D / 8;

  static_assert(BM % 16 == 0, "rows come in m16 tiles");
  static_assert(BN % (16 * NUM_WARPS) == 0, "each warp needs a multiple of 16 keys per tile");
  static_assert(D % 16 == 0, "head dim must be a multiple of 16");
  static_assert(STAGES >= 1 && STAGES <= 4, "1-4 cp.async stages");
  static_assert(SPLITS >= 1 && SPLITS <= 8, "1-8 CTAs per cluster (portable cluster sizes)");
  static_assert((NT & (NT - 1)) == 0, "TreeReduce needs a power-of-two number of n8 tiles per warp");

  using Layout = TileLayout<D, SWIZZLE>;
  static constexpr int Q_TILE = BM * Layout::ROW_ELEMS;  // elements
  static constexpr int KV_TILE = BN * Layout::ROW_ELEMS;
  static constexpr int MAIN_BYTES = (Q_TILE + 2 * STAGES * KV_TILE) * (int)sizeof(T);
  // After the loop: the CTA's O [BM][D] fp32 (unnormalised), per-warp row
  // stats, and the CTA's row max / sum (read by the other CTAs of the cluster).
  static constexpr int COMBINE_BYTES = Q_TILE * (int)sizeof(T) + (BM * D + 2 * NUM_WARPS * BM + 2 * BM) * 4;
  static constexpr int SMEM_BYTES = MAIN_BYTES > COMBINE_BYTES ? MAIN_BYTES : COMBINE_BYTES;
};

}  // namespace fc
