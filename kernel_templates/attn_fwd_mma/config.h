// Compile-time configuration of the mma template (one instantiation per
// variant; tuner/kernels/render.py writes its arguments); its shared-memory
// tiles are common/tile_layout.h's.
#pragma once

#include <stdint.h>

#include "../common/mask.h"
#include "../common/tile_layout.h"

namespace fc {

template <typename T_, int HEAD_DIM_, int BLOCK_M_, int BLOCK_N_, int NUM_WARPS_, int KV_SPLIT_, Swizzle SWIZZLE_,
          int STAGES_, bool Q_IN_REGS_, int MIN_BLOCKS_, bool LAZY_RESCALE_, bool CAUSAL_, class MASK_ = NoMask>
struct AttnConfig {
  using T = T_;
  static constexpr int D = HEAD_DIM_;
  static constexpr int BM = BLOCK_M_;
  static constexpr int BN = BLOCK_N_;
  static constexpr int NUM_WARPS = NUM_WARPS_;
  static constexpr int KV_SPLIT = KV_SPLIT_;
  static constexpr Swizzle SWIZZLE = SWIZZLE_;
  static constexpr int STAGES = STAGES_;
  static constexpr bool Q_IN_REGS = Q_IN_REGS_;
  static constexpr bool CAUSAL = CAUSAL_;
  using Keys = KeyWindow<MASK_, CAUSAL_>;  // which keys a row sees: causal and a window (common/mask.h)
  using Cap = Softcap<MASK_>;
  // CTAs per SM the register allocation must allow (__launch_bounds__'s
  // second argument): 2 caps registers at 65536 / (2 * THREADS) per thread.
  static constexpr int MIN_BLOCKS = MIN_BLOCKS_;
  // Skip the O rescale of a tile when no row max of the warp moved (a vote
  // and a branch per m-tile, against DT*4 multiplies).
  static constexpr bool LAZY_RESCALE = LAZY_RESCALE_;

  static constexpr int THREADS = NUM_WARPS * 32;
  static constexpr int WARPS_M = NUM_WARPS / KV_SPLIT;  // warps stacked along query rows
  static constexpr int ROWS_PER_WARP = BM / WARPS_M;
  static constexpr int MT = ROWS_PER_WARP / 16;  // m16 tiles per warp
  static constexpr int KEYS_PER_WARP = BN / KV_SPLIT;
  static constexpr int NT = KEYS_PER_WARP / 8;  // n8 tiles of S per warp
  static constexpr int KD = D / 16;             // k16 steps of Q.K^T
  static constexpr int KN = KEYS_PER_WARP / 16;  // k16 steps of P.V
  static constexpr int DT = D / 8;              // n8 tiles of O

  static_assert(NUM_WARPS % KV_SPLIT == 0, "KV_SPLIT must divide NUM_WARPS");
  static_assert(BM % (16 * WARPS_M) == 0, "each warp needs a multiple of 16 query rows");
  static_assert(BN % (16 * KV_SPLIT) == 0, "each warp needs a multiple of 16 keys per tile");
  static_assert(D % 16 == 0, "head dim must be a multiple of 16");
  static_assert(STAGES >= 1 && STAGES <= 4, "1-4 cp.async stages");
  static_assert((NT & (NT - 1)) == 0, "TreeReduce needs a power-of-two number of n8 tiles per warp");

  using Layout = TileLayout<D, SWIZZLE>;
  static constexpr int Q_TILE = BM * Layout::ROW_ELEMS;  // elements
  static constexpr int KV_TILE = BN * Layout::ROW_ELEMS;
  static constexpr int MAIN_BYTES = (Q_TILE + 2 * STAGES * KV_TILE) * (int)sizeof(T);
  // The key-split reduction reuses the K/V ring: fp32 O partials + row stats.
  static constexpr int COMBINE_BYTES =
      KV_SPLIT > 1 ? Q_TILE * (int)sizeof(T) + (BM * D + 2 * KV_SPLIT * BM) * 4 : 0;
  static constexpr int SMEM_BYTES = MAIN_BYTES > COMBINE_BYTES ? MAIN_BYTES : COMBINE_BYTES;
};

}  // namespace fc
