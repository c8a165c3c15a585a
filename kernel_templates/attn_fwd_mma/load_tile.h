// The cp.async producer of the mma template: global rows into a shared tile.
#pragma once

#include "../common/ptx_sm80.h"

namespace fc {

// Copy `ROWS` x D elements from global rows [row0, row0 + ROWS) into a tile;
// rows at or past `row_end` are zero-filled.
template <class C, int ROWS>
__device__ __forceinline__ void load_tile(typename C::T* tile, const typename C::T* base, long long row_stride,
                                          int row0, int row_end) {
  constexpr int CHUNKS_PER_ROW = C::D / 8;
  constexpr int TOTAL = ROWS * CHUNKS_PER_ROW;
  constexpr int ITERS = (TOTAL + C::THREADS - 1) / C::THREADS;
  if constexpr (C::THREADS % CHUNKS_PER_ROW == 0) {
    // Each thread keeps one column chunk and steps down the rows: the global
    // address advances by a constant stride instead of a fresh 64-bit product.
    constexpr int ROWS_PER_ITER = C::THREADS / CHUNKS_PER_ROW;
    const int r0 = (int)threadIdx.x / CHUNKS_PER_ROW;
    const int c = ((int)threadIdx.x % CHUNKS_PER_ROW) * 8;
    const typename C::T* src = base + (long long)(row0 + r0) * row_stride + c;
    const long long step = (long long)ROWS_PER_ITER * row_stride;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int r = r0 + it * ROWS_PER_ITER;
      if (TOTAL % C::THREADS == 0 || r < ROWS) {
        const bool valid = row0 + r < row_end;
        cp_async_16(tile + C::Layout::offset(r, c), valid ? src : base, valid);
      }
      src += step;
    }
  } else {
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int i = it * C::THREADS + (int)threadIdx.x;
      if (TOTAL % C::THREADS == 0 || i < TOTAL) {
        const int r = i / CHUNKS_PER_ROW;
        const int c = (i % CHUNKS_PER_ROW) * 8;
        const bool valid = row0 + r < row_end;
        const typename C::T* src = base + (valid ? (long long)(row0 + r) * row_stride + c : 0);
        cp_async_16(tile + C::Layout::offset(r, c), src, valid);
      }
    }
  }
}

}  // namespace fc
