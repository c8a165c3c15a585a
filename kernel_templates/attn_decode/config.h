// Compile-time configuration of the decode template (one instantiation per
// variant; tuner/kernels/render.py writes its arguments).
#pragma once

#include "../common/tile_layout.h"
#include "../common/mask.h"

namespace fc {

// K/V tiles in shared memory as TMA writes them with the 128-byte swizzle:
// boxes of 128 bytes (COLS columns of EB-byte elements) x ROWS rows, one after
// the other along the head dim; in a box, 16-byte chunk c of row r sits at
// chunk c ^ (r % 8). addr() is TileLayout's ldmatrix addressing (a lane's row
// base and swizzled chunk, moved by dr rows, dr % 8 == 0, and dc columns, a
// multiple of a chunk) with the box step added.
template <int ROWS, int EB = 2>
struct TmaTile {
  static constexpr int ROW_BYTES = 128;
  static constexpr int COLS = ROW_BYTES / EB;
  static constexpr int BOX_BYTES = ROWS * ROW_BYTES;
  __device__ static __forceinline__ uint32_t chunk_bytes(int row0, int chunk0) {
    return (uint32_t)((chunk0 ^ (row0 & 7)) << 4);
  }
  // row_base is a multiple of 128 (the tile's rows start on the swizzle's 1024-byte period, rows are 128 bytes
  // apart) and cb < 128, so row_base + cb carries nothing into bits 4-6, which the column XOR flips, and adding
  // multiples of 128 after it commutes with the XOR: one XOR per column on the lane's base (once per tile), not an
  // XOR and an add.
  __device__ static __forceinline__ uint32_t addr(uint32_t row_base, uint32_t cb, int dr, int dc) {
    return ((row_base + cb) ^ (uint32_t)((dc % COLS) * EB)) + (dc / COLS) * BOX_BYTES + dr * ROW_BYTES;
  }
};

// The template's dtype argument for an FP8 KV cache: q and o in Q (half or __nv_bfloat16), K and V e4m3 with
// float32 scales per (batch row, K/V head) (real = stored x scale, vLLM's k_scale / v_scale). Both products
// then run in fp16: e4m3 widens to fp16 exactly, and Q is stored as fp16 times a power of two (kv_fp8.h).
template <class Q>
struct KvE4m3 {};

// q/o element type, K/V element type and the mma's input type of a dtype argument.
template <class T_>
struct DecodeTypes {
  using T = T_;
  using KV = T_;
  using Compute = T_;
  static constexpr bool KV_FP8 = false;
};
template <class Q>
struct DecodeTypes<KvE4m3<Q>> {
  using T = Q;
  using KV = __nv_fp8_e4m3;
  using Compute = half;
  static constexpr bool KV_FP8 = true;
};

template <typename DTYPE_, int HEAD_DIM_, int BLOCK_M_, int BLOCK_N_, int NUM_WARPS_, int SPLITS_, int STAGES_,
          bool CAUSAL_, class MASK_ = NoMask>
struct DecodeConfig {
  using T = typename DecodeTypes<DTYPE_>::T;              // q and o
  using KV = typename DecodeTypes<DTYPE_>::KV;            // k and v
  using Compute = typename DecodeTypes<DTYPE_>::Compute;  // Q in shared memory, the mma inputs
  static constexpr bool KV_FP8 = DecodeTypes<DTYPE_>::KV_FP8;
  static constexpr int D = HEAD_DIM_;
  // Rows of the tile: (query position, query head of the GQA group) pairs, so
  // each K/V tile is read once for the whole group.
  static constexpr int BM = BLOCK_M_;
  static constexpr int BN = BLOCK_N_;
  static constexpr int NUM_WARPS = NUM_WARPS_;
  // CTAs of one thread-block cluster that split the keys; their partial
  // results are merged through distributed shared memory (no workspace).
  static constexpr int SPLITS = SPLITS_;
  static constexpr int STAGES = STAGES_;  // K/V tiles in flight (TMA, one mbarrier per stage)
  static constexpr bool CAUSAL = CAUSAL_;
  using Keys = KeyWindow<MASK_, CAUSAL_>;  // which keys a row sees: causal and a window (common/mask.h)
  using Cap = Softcap<MASK_>;
  // The launcher's tensor maps: 128-byte swizzle (boxes of 64 columns), K/V boxes of BN rows; the Q map
  // is not read (packed rows come from several heads) but has BM rows.
  static constexpr int SWB = 128;
  static constexpr int Q_ROWS = BM;
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
  static_assert(STAGES >= 1 && STAGES <= 4, "1-4 stages");
  static_assert(D % (128 / (int)sizeof(KV)) == 0, "K/V rows are whole 128-byte swizzle boxes");
  static_assert(SPLITS >= 1 && SPLITS <= 16, "1-16 CTAs per cluster (above 8: non-portable, allowed by the launcher)");
  static_assert((NT & (NT - 1)) == 0, "TreeReduce needs a power-of-two number of n8 tiles per warp");

  using QLayout = TileLayout<D, Swizzle::Xor>;  // Q, stored by the threads
  using KVLayout = TmaTile<BN, (int)sizeof(KV)>;
  static constexpr int Q_BYTES = (BM * D * (int)sizeof(Compute) + 1023) / 1024 * 1024;  // K/V boxes stay 1024-aligned
  static constexpr int KV_TILE_BYTES = BN * D * (int)sizeof(KV);
  // + one mbarrier a stage; an FP8 cache adds each warp's max |q| (the block's scale into fp16, kv_fp8.h)
  static constexpr int QMAX_OFFSET = Q_BYTES + 2 * STAGES * KV_TILE_BYTES + 8 * STAGES;
  static constexpr int MAIN_BYTES = QMAX_OFFSET + (KV_FP8 ? 4 * NUM_WARPS : 0);
  // After the loop (the ring reused): the CTA's O [BM][D] fp32 (unnormalised), per-warp row stats, and
  // the CTA's row max / sum (read by the other CTAs of the cluster).
  static constexpr int COMBINE_BYTES = Q_BYTES + (BM * D + 2 * NUM_WARPS * BM + 2 * BM) * 4;
  static constexpr int SMEM_BYTES = MAIN_BYTES > COMBINE_BYTES ? MAIN_BYTES : COMBINE_BYTES;
};

}  // namespace fc
