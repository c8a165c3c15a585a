// The layout of a 16-bit tile in shared memory, rows of D elements addressed
// in 16-byte chunks, and the ldmatrix addressing over it: the sm_80 forward's
// Q, K and V tiles (attn_fwd_mma/config.h) and the decode templates' Q tile
// (attn_decode/config.h).
#pragma once

#include <stdint.h>

namespace fc {

// Shared-memory tile layout; attn_fwd_mma.toml's SWIZZLE values name these
// enumerators (`cxx`).
enum class Swizzle { None, Pad, Xor };

// A tile of `rows` x D elements, addressed in 16-byte chunks (8 elements).
// None: dense rows (a row of 128 bytes puts the 8 rows an ldmatrix phase reads
//   in one bank group: 8-way conflicts). Pad: each row padded by one chunk.
// Xor: chunk index XOR (row % 8), conflict-free without padding (D % 64 == 0).
template <int D, Swizzle SWIZZLE>
struct TileLayout {
  static constexpr int ROW_ELEMS = (SWIZZLE == Swizzle::Pad) ? D + 8 : D;
  static_assert(SWIZZLE != Swizzle::Xor || D % 64 == 0, "XOR swizzle needs D a multiple of 64");
  static constexpr int ROW_BYTES = ROW_ELEMS * 2;  // 16-bit elements
  __device__ static __forceinline__ int offset(int row, int col) {  // col: multiple of 8
    if constexpr (SWIZZLE == Swizzle::Xor) {
      return row * ROW_ELEMS + ((((col >> 3) ^ (row & 7))) << 3);
    } else {
      return row * ROW_ELEMS + col;
    }
  }
  // ldmatrix addressing without a register per fragment: a thread keeps the
  // byte address of its base row and the (swizzled) byte offset of its base
  // chunk (0 or 1); moving by dr rows (dr % 8 == 0, so row & 7 is unchanged)
  // and dc columns (dc % 16 == 0) is then an add and an XOR of constants,
  // which fold into the instruction's immediate offset.
  __device__ static __forceinline__ uint32_t chunk_bytes(int row0, int chunk0) {
    return SWIZZLE == Swizzle::Xor ? (uint32_t)((chunk0 ^ (row0 & 7)) << 4) : (uint32_t)(chunk0 << 4);
  }
  __device__ static __forceinline__ uint32_t addr(uint32_t row_base, uint32_t cb, int dr, int dc) {
    if constexpr (SWIZZLE == Swizzle::Xor) {
      return row_base + dr * ROW_BYTES + (cb ^ (uint32_t)(dc * 2));
    } else {
      return row_base + dr * ROW_BYTES + cb + dc * 2;
    }
  }
};

}  // namespace fc
