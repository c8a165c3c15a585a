// FP8 V for P V: V [B, Hkv, Sk, D] (element strides, D contiguous) copied into V^T [B, Hkv, D, Sk16]
// (contiguous, Sk16 = Sk rounded up to 16, zeros past Sk) with the keys of every 16 in the order the
// consumers' P fragment holds them: column 16g + 4t + 2h + j holds key 16g + 8h + 2t + j
// (consumer_mainloop.h, pack_p). FP8 wgmma reads both operands K-major; this makes V's. A memory-bound
// pass, one read and one write of V (about 2% of an S8192 D128 prefill); the launcher
// (tuner/runtime/shipped/fp8.py) runs it before each e4m3 launch.
//
// One CTA of 128 threads moves a tile of 64 keys x 32 head-dim bytes: coalesced 16-byte loads of the
// key rows into shared memory, then 16-byte stores of the output rows, each gathering its 16 bytes from
// a shared-memory column in the permuted order. Every Hopper cubin carries it (a fixed entry name, not
// per variant): an FP8 variant's launcher loads it from the same cubin.
#pragma once

#include <stdint.h>

namespace fc {

constexpr int VT_KEYS = 64, VT_DIMS = 32, VT_THREADS = 128;
constexpr int VT_STRIDE = VT_DIMS + 4;  // bytes per shared row: column reads by 8 rows of a warp hit 2 banks at most

__device__ __forceinline__ void v_transpose_tile(const uint8_t* v, uint8_t* vt, long long v_sb, long long v_sh,
                                                 long long v_ss, int hkv, int sk, int sk16, int d) {
  __shared__ __align__(16) uint8_t tile[VT_KEYS * VT_STRIDE];
  const int key0 = blockIdx.x * VT_KEYS, d0 = blockIdx.y * VT_DIMS;
  const int b = blockIdx.z / hkv, h = blockIdx.z % hkv;
  const int tid = threadIdx.x;
  {  // key row r, 16-byte chunk c of this tile's head-dim range
    const int r = tid / 2, c = tid % 2, key = key0 + r;
    uint4 x = make_uint4(0, 0, 0, 0);
    if (key < sk) x = *reinterpret_cast<const uint4*>(v + b * v_sb + h * v_sh + key * v_ss + d0 + 16 * c);
    uint32_t* dst = reinterpret_cast<uint32_t*>(tile + r * VT_STRIDE + 16 * c);
    dst[0] = x.x, dst[1] = x.y, dst[2] = x.z, dst[3] = x.w;
  }
  __syncthreads();
  // output row (head-dim element) dd, 16 keys from column 16g of the tile
  const int dd = tid / 4, g = tid % 4, col0 = key0 + 16 * g;
  if (col0 >= sk16) return;
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // bytes 4i..4i+3: columns 4t + 2h + j with t = i
    uint32_t x = 0;
#pragma unroll
    for (int hj = 0; hj < 4; ++hj) {
      const int key = 16 * g + 8 * (hj / 2) + 2 * i + (hj % 2);
      x |= static_cast<uint32_t>(tile[key * VT_STRIDE + dd]) << (8 * hj);
    }
    w[i] = x;
  }
  *reinterpret_cast<uint4*>(vt + (static_cast<long long>(blockIdx.z) * d + d0 + dd) * sk16 + col0) =
      make_uint4(w[0], w[1], w[2], w[3]);
}

}  // namespace fc

// Grid (ceil(Sk16 / 64), D / 32, B * Hkv), 128 threads; d a multiple of 32, strides in bytes (= elements).
extern "C" __global__ void __launch_bounds__(fc::VT_THREADS)
    fc_v_transpose_e4m3(const uint8_t* v, uint8_t* vt, long long v_sb, long long v_sh, long long v_ss, int hkv,
                        int sk, int sk16, int d) {
  fc::v_transpose_tile(v, vt, v_sb, v_sh, v_ss, hkv, sk, sk16, d);
}
