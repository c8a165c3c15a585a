// sm_90a PTX wrappers of the Hopper template: mbarriers, TMA, setmaxnreg,
// named barriers, wgmma synchronisation and shared-memory descriptors.
#pragma once

#include <stdint.h>

namespace fc {

// CUtensorMap is an opaque, 64-byte aligned 128-byte object; declaring our
// own avoids depending on cuda.h's version of it.
struct alignas(64) TmaDesc {
  unsigned long long opaque[16];
};

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Spin until the barrier's phase with this parity has completed. (A loop
// written inside one asm block, with its own label, deadlocked on the H200
// once inlined several times; the C++ loop around try_wait is what runs.)
__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

// Four 8x8 tiles of 16-bit values to shared memory (one per register; lane l gives row l % 8 of tile l / 8),
// each thread's register holding its mma/wgmma accumulator fragment's pair: (row lane / 4, columns 2 (lane % 4)).
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

// The same, each 8 x 8 matrix stored transposed (register r's row of lane l's matrix becomes a column).
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// One box of a 4-D tensor map into shared memory, completing on `bar`.
__device__ __forceinline__ void tma_load(uint32_t dst, const TmaDesc* map, uint32_t bar, int c0, int c1, int c2,
                                         int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, "
      "%6}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
__device__ __forceinline__ void tma_prefetch_map(const TmaDesc* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

template <int REGS>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
template <int REGS>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}

// Named barriers 1..3 order the consumers' tensor-core work (ping-pong);
// 4..6 synchronise one consumer warpgroup around its epilogue.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// wgmma writes its accumulators asynchronously; this empty asm, placed after
// a wait, keeps the compiler from reading (or writing) them any earlier.
template <int R>
__device__ __forceinline__ void fence_regs(float* r) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// Shared-memory matrix descriptor of wgmma. Tiles are stored as column
// blocks of SWB bytes per row (the TMA box width), swizzled by TMA with the
// same pattern wgmma expects; `lbo`/`sbo` are the byte strides between
// column blocks and between groups of 8 rows.
template <int SWB>
__device__ __forceinline__ uint64_t make_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  constexpr uint64_t mode = SWB == 128 ? 1 : (SWB == 64 ? 2 : 3);
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
         (static_cast<uint64_t>(sbo >> 4) << 32) | (mode << 62);
}

// The same descriptor `bytes` further on: only the start address field (low
// word, 16-byte units) moves, and shared memory ends below 256 KB, so the
// field never carries into the next one. A 64-bit add lets ptxas keep each
// descriptor pair whole in uniform registers (one UIADD3.64 per wgmma); the
// low word alone (`Wide` false) rebuilds the pair's high word with a UMOV per
// wgmma, but holds half the uniform registers where a loop issues many.
template <bool Wide = true>
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) {
  if constexpr (Wide) return desc + (bytes >> 4);
  const uint32_t lo = static_cast<uint32_t>(desc) + (bytes >> 4);
  return (desc & 0xFFFFFFFF00000000ull) | lo;
}

// `x` through a move the compiler cannot see into: what it knows of x's bits (a descriptor's clear low bits,
// which turn later adds into ORs and split the pair) does not carry past it.
__device__ __forceinline__ uint64_t opaque(uint64_t x) {
  uint64_t y;
  asm("mov.b64 %0, %1;" : "=l"(y) : "l"(x));
  return y;
}

// dst[0] += a, dst[1] += b in global memory, one vector reduction (sm_90: red.global.add.v2.f32; dst 8-byte
// aligned): half the instructions of two scalar atomicAdds whose results are unused.
__device__ __forceinline__ void red_add_v2(float* dst, float a, float b) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(dst), "f"(a), "f"(b) : "memory");
}

// dst[0 .. 4) += v in global memory, one vector reduction (sm_90: red.global.add.v4.f32; dst 16-byte aligned).
__device__ __forceinline__ void red_add_v4(float* dst, float4 v) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
}

// True in one lane of the (converged) warp: elect.sync, so ptxas issues what it guards once, not per lane.
__device__ __forceinline__ bool elect_one() {
  uint32_t pred = 0;
  asm volatile("{\n.reg .pred p;\nelect.sync _|p, 0xffffffff;\nselp.u32 %0, 1, 0, p;\n}\n" : "=r"(pred));
  return pred != 0;
}

// `bytes` contiguous bytes from global to shared memory (both 16-byte aligned, a multiple of 16), completing on
// `bar` (sm_90 bulk copy, no tensor map).
__device__ __forceinline__ void bulk_load(void* dst, const void* src, int bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// dst[0 .. bytes / 4) += src[...] (fp32), shared to global, by the TMA unit (sm_90 bulk reduction; both 16-byte
// aligned, bytes a multiple of 16), in this thread's current bulk group.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, const float* src, int bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
               "r"(smem_u32(src)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// This thread's bulk groups but the newest N have read their shared source (it may be written again).
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// This thread's bulk groups but the newest N are complete (their global writes done).
template <int N>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// The cluster barrier and distributed shared memory: the builtins cooperative_groups' cluster_group::sync()
// and map_shared_rank() call (cuda_runtime.h declares them), without <cooperative_groups.h>'s parse time.
__device__ __forceinline__ void cluster_sync() {
  __cluster_barrier_arrive();
  __cluster_barrier_wait();
}
template <class T>
__device__ __forceinline__ T* map_shared_rank(T* addr, int rank) {
  return static_cast<T*>(__cluster_map_shared_rank(addr, rank));
}

}  // namespace fc
