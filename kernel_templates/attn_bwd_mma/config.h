// Compile-time configuration of the sm_80+ backward template (one instantiation per variant; tuner/kernels/render.py
// writes its arguments). A CTA owns BLOCK_N keys of one K/V head and loops over the query tiles (BLOCK_M rows) of
// every query head of its GQA group; its NUM_WARPS warps split the keys (each warp KEYS_PER_WARP of them) for
// S^T, dP^T, dV and dK, and split the BLOCK_M x D tile of dQ (WQ_M x WQ_N warps) for dS K.
#pragma once

#include <stdint.h>

#include "../common/mask.h"
#include "../common/tile_layout.h"

namespace fc {

template <typename T_, int HEAD_DIM_, int BLOCK_M_, int BLOCK_N_, int NUM_WARPS_, Swizzle SWIZZLE_, int STAGES_,
          bool CAUSAL_, class MASK_ = NoMask>
struct BwdConfig {
  using T = T_;
  static constexpr int D = HEAD_DIM_;
  static constexpr int BM = BLOCK_M_;  // query rows per step of the loop
  static constexpr int BN = BLOCK_N_;  // keys per CTA
  static constexpr int NUM_WARPS = NUM_WARPS_;
  static constexpr bool DQ_TILED = false;  // dq_accum row-major (rows.h's dq_index)
  static constexpr bool DQ_T = false;  // nor in transposed blocks
  static constexpr Swizzle SWIZZLE = SWIZZLE_;
  static constexpr int STAGES = STAGES_;  // cp.async buffers of the Q / dO / lse / delta tiles
  static constexpr bool CAUSAL = CAUSAL_;
  using Keys = KeyWindow<MASK_, CAUSAL_>;  // which keys a query row sees (common/mask.h)
  using Mask = MASK_;
  using Cap = Softcap<MASK_>;
  static constexpr int MIN_BLOCKS = 1;

  static constexpr int THREADS = NUM_WARPS * 32;
  // S^T, dP^T, dV, dK: warps split the keys; each holds KEYS_PER_WARP key rows x all BM query columns.
  static constexpr int KEYS_PER_WARP = BN / NUM_WARPS;
  static constexpr int MT = KEYS_PER_WARP / 16;  // m16 tiles (keys) per warp
  static constexpr int NT = BM / 8;              // n8 tiles (queries) of S^T
  static constexpr int KD = D / 16;              // k16 steps over the head dim
  static constexpr int DT = D / 8;               // n8 tiles of dK and dV
  // dQ = dS K: warps split the BM x D tile, WQ_M along the query rows, WQ_N along the head dim.
  static constexpr int WQ_M = NUM_WARPS < BM / 16 ? NUM_WARPS : BM / 16;
  static constexpr int WQ_N = NUM_WARPS / WQ_M;
  static constexpr int MQ = BM / WQ_M / 16;  // m16 tiles of dQ per warp
  static constexpr int NQ = D / WQ_N / 8;    // n8 tiles of dQ per warp

  static_assert(BN % (16 * NUM_WARPS) == 0, "each warp needs a multiple of 16 keys");
  static_assert(BM % 16 == 0 && BM <= 128, "BLOCK_M: a multiple of 16, at most ROW_PAD");
  static_assert(NUM_WARPS % WQ_M == 0 && (D / WQ_N) % 16 == 0, "each warp needs 16 dQ columns or a multiple");
  static_assert(D % 16 == 0 && D <= 256, "head dim a multiple of 16");
  static_assert(32 % (D / 8) == 0, "the row kernels reduce a row over D / 8 lanes of one warp");
  static_assert(STAGES == 1 || STAGES == 2, "1 or 2 cp.async stages");

  using Layout = TileLayout<D, SWIZZLE>;    // Q, dO, K, V tiles
  using DsLayout = TileLayout<BM, SWIZZLE>;  // dS^T: BN key rows of BM queries
  static constexpr int Q_TILE = BM * Layout::ROW_ELEMS;  // elements
  static constexpr int KV_TILE = BN * Layout::ROW_ELEMS;
  static constexpr int DS_TILE = BN * DsLayout::ROW_ELEMS;
  static constexpr int SMEM_BYTES = (2 * KV_TILE + 2 * STAGES * Q_TILE + DS_TILE) * (int)sizeof(T) + 2 * STAGES * BM * 4;

  // The per-row kernels (rowsum(dO * O) before, dQ's conversion after): D / 8 lanes per row, 16 bytes each.
  static constexpr int AUX_THREADS = 128;
  static constexpr int AUX_ROWS = AUX_THREADS / (D / 8);
  // lse (log2 units) and delta are kept per (batch, head) in rows padded to a multiple of ROW_PAD: a query tile
  // reads them with 16-byte copies and no bounds check (padding rows: lse +inf, delta 0, so P = 0 there).
  static constexpr int ROW_PAD = 128;
};

}  // namespace fc
