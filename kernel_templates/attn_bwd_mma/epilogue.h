// The end of the backward's main kernel: each warp's dK (times the softmax scale) and dV rounded to T into the
// K and V tiles (free once every warp is past the last dQ), then out in 16-byte rows (keys < Sk).
#pragma once

#include <stdint.h>

#include "../common/utils.h"

namespace fc {

// A warp's accumulator rows (its keys) times `mul` into a tile of layout L.
template <class C>
__device__ __forceinline__ void acc_to_tile(typename C::T* tile, const float (&acc)[C::MT][C::DT][4], float mul,
                                            int key_base, int g, int t) {
  using L = typename C::Layout;
#pragma unroll
  for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = key_base + mt * 16 + g + r * 8;
#pragma unroll
      for (int dt = 0; dt < C::DT; ++dt)
        *reinterpret_cast<uint32_t*>(tile + L::offset(row, dt * 8) + 2 * t) =
            pack2<typename C::T>(acc[mt][dt][2 * r] * mul, acc[mt][dt][2 * r + 1] * mul);
    }
}

// The tile's rows n0 .. n0 + BN (those < Sk) to global rows of stride `stride`.
template <class C>
__device__ __forceinline__ void tile_to_global(typename C::T* dst, long long stride, const typename C::T* tile, int n0,
                                               int sk) {
  constexpr int CHUNKS_PER_ROW = C::D / 8;
  for (int i = threadIdx.x; i < C::BN * CHUNKS_PER_ROW; i += C::THREADS) {
    const int r = i / CHUNKS_PER_ROW, c = (i % CHUNKS_PER_ROW) * 8;
    if (n0 + r < sk)
      *reinterpret_cast<uint4*>(dst + (long long)(n0 + r) * stride + c) =
          *reinterpret_cast<const uint4*>(tile + C::Layout::offset(r, c));
  }
}

}  // namespace fc
