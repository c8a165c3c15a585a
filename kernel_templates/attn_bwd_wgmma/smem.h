// Shared memory of the wgmma backward: the swizzled 16-bit tiles (config.h's layout) and their cp.async loads.
// cp.async writes through the generic proxy and wgmma reads through the async proxy, hence fence_proxy_async()
// between a tile's landing and the barrier before the wgmmas that read it.
#pragma once

#include <stdint.h>

#include "../common/ptx_sm80.h"
#include "../common/ptx_sm90.h"
#include "../common/utils.h"

namespace fc {

// Byte offset of 16-byte chunk `chunk` (8 elements) of row r in a swizzled tile of `rows` rows.
__device__ __forceinline__ uint32_t sw128_offset(int r, int chunk, int rows) {
  return (uint32_t)((chunk / 8) * rows * 128 + r * 128 + (((chunk % 8) ^ (r % 8)) << 4));
}

__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Rows row0 .. row0 + ROWS of a [rows, D] global matrix (row stride `stride`, elements) into a swizzled tile;
// rows at or past `n` zero-filled (the source address then stays in bounds: row 0). Thread i copies chunk
// i % CHUNKS of rows i / CHUNKS + j * RSTEP: RSTEP is a multiple of 8, so every copy's swizzled offset is the first
// one's plus j * RSTEP rows (the loop unrolled, no address arithmetic per chunk beyond two adds).
// The loading threads are the first NWG * 128 (a PRODUCER CTA's 384 would not divide the rows).
template <class C, int ROWS>
__device__ __forceinline__ void load_rows(uint8_t* tile, const typename C::T* src, long long stride, int row0, int n) {
  constexpr int CHUNKS = C::D / 8;
  constexpr int LOADERS = C::NWG * 128;
  constexpr int RSTEP = LOADERS / CHUNKS;
  static_assert(LOADERS % CHUNKS == 0 && RSTEP % 8 == 0 && ROWS % RSTEP == 0, "whole swizzle rows per step");
  if (C::THREADS > LOADERS && threadIdx.x >= LOADERS) return;
  const int r0 = threadIdx.x / CHUNKS, c = threadIdx.x % CHUNKS;
  uint8_t* dst = tile + sw128_offset(r0, c, ROWS);
  const typename C::T* from = src + (long long)(row0 + r0) * stride + c * 8;
#pragma unroll
  for (int j = 0; j < ROWS / RSTEP; ++j) {
    const bool valid = row0 + r0 + j * RSTEP < n;
    cp_async_16(dst + j * RSTEP * 128, valid ? from + j * RSTEP * stride : src, valid);
  }
}

// The CTA's shared regions (base aligned to 1024 bytes).
template <class C>
struct WgSmem {
  uint8_t* base;
  __device__ __forceinline__ uint8_t* k() const { return base; }
  __device__ __forceinline__ uint8_t* v() const { return base + C::OFF_V; }
  __device__ __forceinline__ uint8_t* q(int st) const { return base + C::OFF_Q + st * C::Q_BYTES; }
  __device__ __forceinline__ uint8_t* dout(int st) const { return base + C::OFF_DO + st * C::Q_BYTES; }
  __device__ __forceinline__ uint8_t* ds(int wg) const { return base + C::OFF_DS + wg * C::DS_BYTES; }
  __device__ __forceinline__ float* lse(int st) const { return reinterpret_cast<float*>(base + C::OFF_LSE) + st * C::BM; }
  __device__ __forceinline__ float* delta(int st) const {
    return reinterpret_cast<float*>(base + C::OFF_DELTA) + st * C::BM;
  }
  // PRODUCER's ring: slot st's loads landed (count 1: the producer's expect_tx); its wgmmas are done (one arrival
  // per consumer warp).
  __device__ __forceinline__ uint32_t q_full(int st) const { return smem_u32(base + C::OFF_BAR) + 8 * st; }
  __device__ __forceinline__ uint32_t q_empty(int st) const {
    return smem_u32(base + C::OFF_BAR) + 8 * (C::STAGES + st);
  }
  __device__ __forceinline__ void init_barriers() const {
    for (int st = 0; st < C::STAGES; ++st) {
      mbar_init(q_full(st), 1);
      mbar_init(q_empty(st), 4 * C::NWG);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __device__ __forceinline__ float* dq_stage(int blk, int buf = 0) const {  // buf < DQ_BUFS
    return reinterpret_cast<float*>(base + C::OFF_DQS + (buf * C::DQ_BLOCKS + blk) * C::DQS_BYTES);
  }
};

}  // namespace fc
