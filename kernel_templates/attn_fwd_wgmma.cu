// FlashAttention-3-style fused attention forward pass for Hopper (sm_90a).
//
// A CTA computes BM = 64 * CONSUMERS query rows of one (batch, head) at a
// time: one such work item per CTA, or (PERSISTENT) about one CTA per SM
// striding over all of them:
//   * warpgroup 0 is the producer: after giving registers back (setmaxnreg),
//     one thread streams K and V tiles with TMA (cp.async.bulk.tensor) into
//     a STAGES-deep shared-memory ring, and another loads each consumer's Q
//     rows once per work item; every copy completes on an mbarrier (full),
//     and consumers free a slot or their Q rows with another (empty).
//   * warpgroups 1..CONSUMERS are consumers, each owning 64 query rows:
//     S = Q K^T with wgmma (both operands in shared memory, K-major), online
//     softmax in registers (exp2), O += P V with wgmma (P from registers, V
//     read MN-major straight from the TMA tile: no transpose pass).
// Tunables: tile sizes, ring depth, the TMA/wgmma swizzle width, softmax
// overlapped with the next Q K^T inside a warpgroup (OVERLAP), ping-pong
// ordering of the consumers' tensor-core work (PINGPONG), how registers are
// split between producer and consumers (PRODUCER_REGS), and the persistent
// grid (PERSISTENT).
//
// Problem: Q [B, H, Sq, D], K/V [B, Hkv, Sk, D], O like Q, all given by
// element strides (the head dim is contiguous); the host encodes one 4-D TMA
// tensor map per input (D, S, H, B), so BHSD, BSHD and GQA need no copy and
// rows past Sq/Sk read as zeros. Causal masking is bottom-right aligned:
// query i sees key j iff j <= i + (Sk - Sq). Rows that see no key produce 0
// and lse = -inf.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace fc {

// CUtensorMap is an opaque, 64-byte aligned 128-byte object; declaring our
// own avoids depending on cuda.h's version of it.
struct alignas(64) TmaDesc {
  unsigned long long opaque[16];
};

struct AttnArgs {
  void* o;
  float* lse;  // [B, H, Sq] contiguous, or null
  long long o_sb, o_sh, o_ss;
  int sq, sk, h_per_kv;
  float scale;  // softmax scale (natural units)
  int heads, batch;
};

constexpr float NEG_INF = -__builtin_huge_valf();

// ---------------------------------------------------------------- PTX wrappers

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

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
// field never carries. One uniform add per wgmma instead of rebuilding the
// descriptor from the address (mask, shift, or: the issue slots matter).
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) {
  const uint32_t lo = static_cast<uint32_t>(desc) + (bytes >> 4);
  return (desc & 0xFFFFFFFF00000000ull) | lo;
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

template <bool BF16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (BF16) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  } else {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
}

// ---- BEGIN GENERATED wgmma wrappers (tools/gen_wgmma_wrappers.py; do not edit)
template <int N>
struct Wgmma;  // m64nNk16, fp32 accumulators d[N/2] in the wgmma fragment order
template <>
struct Wgmma<64> {
  template <bool BF16, int TRANS_B>
  __device__ static __forceinline__ void ss(float* d, uint64_t da, uint64_t db, int scale_d) {
    if constexpr (BF16 == false)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                   "%32, %33, p, 1, 1, 0, %35;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
          : "l"(da), "l"(db), "r"(scale_d), "n"(TRANS_B));
    if constexpr (BF16 == true)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                   "%32, %33, p, 1, 1, 0, %35;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
          : "l"(da), "l"(db), "r"(scale_d), "n"(TRANS_B));
  }
  template <bool BF16>
  __device__ static __forceinline__ void rs(float* d, const uint32_t* a, uint64_t db, int scale_d) {
    if constexpr (BF16 == false)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                   "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
    if constexpr (BF16 == true)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                   "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
  }
};
template <>
struct Wgmma<80> {
  template <bool BF16, int TRANS_B>
  __device__ static __forceinline__ void ss(float* d, uint64_t da, uint64_t db, int scale_d) {
    if constexpr (BF16 == false)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %42, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n80k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39}, "
                   "%40, %41, p, 1, 1, 0, %43;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39])
          : "l"(da), "l"(db), "r"(scale_d), "n"(TRANS_B));
    if constexpr (BF16 == true)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %42, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39}, "
                   "%40, %41, p, 1, 1, 0, %43;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39])
          : "l"(da), "l"(db), "r"(scale_d), "n"(TRANS_B));
  }
  template <bool BF16>
  __device__ static __forceinline__ void rs(float* d, const uint32_t* a, uint64_t db, int scale_d) {
    if constexpr (BF16 == false)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %45, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n80k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39}, "
                   "{%40, %41, %42, %43}, %44, p, 1, 1, 1;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
    if constexpr (BF16 == true)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %45, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39}, "
                   "{%40, %41, %42, %43}, %44, p, 1, 1, 1;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
  }
};
template <>
struct Wgmma<96> {
  template <bool BF16, int TRANS_B>
  __device__ static __forceinline__ void ss(float* d, uint64_t da, uint64_t db, int scale_d) {
    if constexpr (BF16 == false)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %50, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n96k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, "
                   "%48, %49, p, 1, 1, 0, %51;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
          : "l"(da), "l"(db), "r"(scale_d), "n"(TRANS_B));
    if constexpr (BF16 == true)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %50, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n96k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, "
                   "%48, %49, p, 1, 1, 0, %51;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
          : "l"(da), "l"(db), "r"(scale_d), "n"(TRANS_B));
  }
  template <bool BF16>
  __device__ static __forceinline__ void rs(float* d, const uint32_t* a, uint64_t db, int scale_d) {
    if constexpr (BF16 == false)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %53, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n96k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, "
                   "{%48, %49, %50, %51}, %52, p, 1, 1, 1;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
    if constexpr (BF16 == true)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %53, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n96k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, "
                   "{%48, %49, %50, %51}, %52, p, 1, 1, 1;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
  }
};
template <>
struct Wgmma<112> {
  template <bool BF16, int TRANS_B>
  __device__ static __forceinline__ void ss(float* d, uint64_t da, uint64_t db, int scale_d) {
    if constexpr (BF16 == false)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %58, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n112k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55}, "
                   "%56, %57, p, 1, 1, 0, %59;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55])
          : "l"(da), "l"(db), "r"(scale_d), "n"(TRANS_B));
    if constexpr (BF16 == true)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %58, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n112k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55}, "
                   "%56, %57, p, 1, 1, 0, %59;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55])
          : "l"(da), "l"(db), "r"(scale_d), "n"(TRANS_B));
  }
  template <bool BF16>
  __device__ static __forceinline__ void rs(float* d, const uint32_t* a, uint64_t db, int scale_d) {
    if constexpr (BF16 == false)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %61, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n112k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55}, "
                   "{%56, %57, %58, %59}, %60, p, 1, 1, 1;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
    if constexpr (BF16 == true)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %61, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n112k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55}, "
                   "{%56, %57, %58, %59}, %60, p, 1, 1, 1;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
  }
};
template <>
struct Wgmma<128> {
  template <bool BF16, int TRANS_B>
  __device__ static __forceinline__ void ss(float* d, uint64_t da, uint64_t db, int scale_d) {
    if constexpr (BF16 == false)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
                   "%64, %65, p, 1, 1, 0, %67;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
              "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
          : "l"(da), "l"(db), "r"(scale_d), "n"(TRANS_B));
    if constexpr (BF16 == true)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
                   "%64, %65, p, 1, 1, 0, %67;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
              "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
          : "l"(da), "l"(db), "r"(scale_d), "n"(TRANS_B));
  }
  template <bool BF16>
  __device__ static __forceinline__ void rs(float* d, const uint32_t* a, uint64_t db, int scale_d) {
    if constexpr (BF16 == false)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
                   "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
              "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
    if constexpr (BF16 == true)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
                   "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
              "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
  }
};
template <>
struct Wgmma<144> {
  template <bool BF16, int TRANS_B>
  __device__ static __forceinline__ void ss(float* d, uint64_t da, uint64_t db, int scale_d) {
    if constexpr (BF16 == false)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %74, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n144k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71}, "
                   "%72, %73, p, 1, 1, 0, %75;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
              "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
              "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71])
          : "l"(da), "l"(db), "r"(scale_d), "n"(TRANS_B));
    if constexpr (BF16 == true)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %74, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n144k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71}, "
                   "%72, %73, p, 1, 1, 0, %75;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
              "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
              "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71])
          : "l"(da), "l"(db), "r"(scale_d), "n"(TRANS_B));
  }
  template <bool BF16>
  __device__ static __forceinline__ void rs(float* d, const uint32_t* a, uint64_t db, int scale_d) {
    if constexpr (BF16 == false)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %77, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n144k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71}, "
                   "{%72, %73, %74, %75}, %76, p, 1, 1, 1;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
              "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
              "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
    if constexpr (BF16 == true)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %77, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n144k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71}, "
                   "{%72, %73, %74, %75}, %76, p, 1, 1, 1;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
              "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
              "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
  }
};
template <>
struct Wgmma<160> {
  template <bool BF16, int TRANS_B>
  __device__ static __forceinline__ void ss(float* d, uint64_t da, uint64_t db, int scale_d) {
    if constexpr (BF16 == false)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %82, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n160k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79}, "
                   "%80, %81, p, 1, 1, 0, %83;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
              "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
              "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
              "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79])
          : "l"(da), "l"(db), "r"(scale_d), "n"(TRANS_B));
    if constexpr (BF16 == true)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %82, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n160k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79}, "
                   "%80, %81, p, 1, 1, 0, %83;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
              "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
              "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
              "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79])
          : "l"(da), "l"(db), "r"(scale_d), "n"(TRANS_B));
  }
  template <bool BF16>
  __device__ static __forceinline__ void rs(float* d, const uint32_t* a, uint64_t db, int scale_d) {
    if constexpr (BF16 == false)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %85, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n160k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79}, "
                   "{%80, %81, %82, %83}, %84, p, 1, 1, 1;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
              "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
              "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
              "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
    if constexpr (BF16 == true)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %85, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n160k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79}, "
                   "{%80, %81, %82, %83}, %84, p, 1, 1, 1;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
              "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
              "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
              "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
  }
};
template <>
struct Wgmma<176> {
  template <bool BF16, int TRANS_B>
  __device__ static __forceinline__ void ss(float* d, uint64_t da, uint64_t db, int scale_d) {
    if constexpr (BF16 == false)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %90, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n176k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87}, "
                   "%88, %89, p, 1, 1, 0, %91;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
              "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
              "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
              "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
              "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87])
          : "l"(da), "l"(db), "r"(scale_d), "n"(TRANS_B));
    if constexpr (BF16 == true)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %90, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n176k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87}, "
                   "%88, %89, p, 1, 1, 0, %91;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
              "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
              "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
              "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
              "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87])
          : "l"(da), "l"(db), "r"(scale_d), "n"(TRANS_B));
  }
  template <bool BF16>
  __device__ static __forceinline__ void rs(float* d, const uint32_t* a, uint64_t db, int scale_d) {
    if constexpr (BF16 == false)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %93, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n176k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87}, "
                   "{%88, %89, %90, %91}, %92, p, 1, 1, 1;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
              "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
              "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
              "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
              "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
    if constexpr (BF16 == true)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %93, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n176k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87}, "
                   "{%88, %89, %90, %91}, %92, p, 1, 1, 1;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
              "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
              "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
              "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
              "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
  }
};
template <>
struct Wgmma<192> {
  template <bool BF16, int TRANS_B>
  __device__ static __forceinline__ void ss(float* d, uint64_t da, uint64_t db, int scale_d) {
    if constexpr (BF16 == false)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n192k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, "
                   "%96, %97, p, 1, 1, 0, %99;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
              "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
              "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
              "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
              "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
              "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
          : "l"(da), "l"(db), "r"(scale_d), "n"(TRANS_B));
    if constexpr (BF16 == true)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, "
                   "%96, %97, p, 1, 1, 0, %99;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
              "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
              "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
              "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
              "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
              "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
          : "l"(da), "l"(db), "r"(scale_d), "n"(TRANS_B));
  }
  template <bool BF16>
  __device__ static __forceinline__ void rs(float* d, const uint32_t* a, uint64_t db, int scale_d) {
    if constexpr (BF16 == false)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %101, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n192k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, "
                   "{%96, %97, %98, %99}, %100, p, 1, 1, 1;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
              "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
              "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
              "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
              "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
              "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
    if constexpr (BF16 == true)
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %101, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, "
                   "{%96, %97, %98, %99}, %100, p, 1, 1, 1;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
              "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
              "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
              "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
              "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
              "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
  }
};
// ---- END GENERATED wgmma wrappers

// ---------------------------------------------------------------- configuration

template <class T>
struct IsBf16 {
  static constexpr bool value = false;
};
template <>
struct IsBf16<__nv_bfloat16> {
  static constexpr bool value = true;
};

template <class T_, int D_, int BM_, int BN_, int STAGES_, int SWB_, bool OVERLAP_, bool PINGPONG_,
          int PRODUCER_REGS_, bool PERSISTENT_, bool CAUSAL_>
struct HopperConfig {
  using T = T_;
  static constexpr bool BF16 = IsBf16<T>::value;
  static constexpr int D = D_, BM = BM_, BN = BN_, STAGES = STAGES_;
  static constexpr int SWB = SWB_;        // swizzle width in bytes: 32, 64 or 128
  static constexpr int E = SWB / 2;       // elements per swizzled row = TMA box width
  static constexpr int CB = D / E;        // column blocks per tile
  static constexpr bool OVERLAP = OVERLAP_, PINGPONG = PINGPONG_, PERSISTENT = PERSISTENT_, CAUSAL = CAUSAL_;
  static constexpr int CONSUMERS = BM / 64;
  static constexpr int THREADS = 128 * (CONSUMERS + 1);
  static constexpr int MIN_BLOCKS = 1;
  static constexpr int PRODUCER_REGS = PRODUCER_REGS_;
  // setmaxnreg moves registers inside the CTA's own pool, which is what it was
  // launched with: THREADS x LAUNCH_REGS (ptxas gives a setmaxnreg kernel the
  // most its launch bounds allow: 168 for 384 threads, 128 for 512). Asking
  // for more than the producer gave back blocks forever. One consumer (256
  // threads) already has 240+ registers: no split.
  static constexpr bool SPLIT_REGS = CONSUMERS > 1;
  static constexpr int LAUNCH_REGS = (65536 / THREADS > 255 ? 255 : 65536 / THREADS) / 8 * 8;
  static constexpr int CONSUMER_REGS_RAW = (LAUNCH_REGS * (CONSUMERS + 1) - PRODUCER_REGS) / CONSUMERS / 8 * 8;
  static constexpr int CONSUMER_REGS = !SPLIT_REGS ? 240 : (CONSUMER_REGS_RAW > 240 ? 240 : CONSUMER_REGS_RAW);
  static_assert(!SPLIT_REGS || 128 * PRODUCER_REGS + 128 * CONSUMERS * CONSUMER_REGS <= THREADS * LAUNCH_REGS,
                "register split exceeds the CTA's register pool");
  static constexpr int Q_ROWS = 64;  // rows of a Q box: each consumer's rows load (and free) on their own
  static constexpr int Q_BYTES = BM * D * 2;
  static constexpr int KV_BYTES = BN * D * 2;  // one K or one V tile
  static constexpr int SMEM_BYTES = 1024 + Q_BYTES + 2 * STAGES * KV_BYTES + 256;
  static_assert((2 * CONSUMERS + 4 * STAGES) * 8 <= 256, "mbarriers must fit their 256 bytes");
  static_assert(BM % 64 == 0 && CONSUMERS >= 1 && CONSUMERS <= 3, "BM must be 64, 128 or 192");
  static_assert(BN % 16 == 0 && BN <= 256, "BN must be a multiple of 16, at most 256");
  static_assert(SWB == 32 || SWB == 64 || SWB == 128, "swizzle is 32, 64 or 128 bytes");
  static_assert(D % E == 0, "head dim must be a multiple of the swizzle width");
  static_assert(!PINGPONG || CONSUMERS >= 2, "ping-pong needs two consumer warpgroups");
  static_assert(PRODUCER_REGS >= 24 && PRODUCER_REGS % 8 == 0, "setmaxnreg takes multiples of 8 from 24");
};

// ---------------------------------------------------------------- consumer pieces

// S = Q K^T for one warpgroup: 64 x BN, D/16 wgmma steps along the head dim.
template <class C>
__device__ __forceinline__ void issue_qk(float* s, uint32_t q_base, uint32_t k_base) {
  const uint64_t qd = make_desc<C::SWB>(q_base, 16, 8 * C::SWB), kd = make_desc<C::SWB>(k_base, 16, 8 * C::SWB);
#pragma unroll
  for (int kk = 0; kk < C::D / 16; ++kk) {
    const uint32_t cb = kk * 16 / C::E, off = (kk * 16) % C::E * 2;  // column block, bytes into its row
    const uint64_t da = desc_advance(qd, cb * C::BM * C::SWB + off);
    const uint64_t db = desc_advance(kd, cb * C::BN * C::SWB + off);
    Wgmma<C::BN>::template ss<C::BF16, 0>(s, da, db, kk > 0 ? 1 : 0);
  }
}

// O += P V: BN/16 wgmma steps along the keys; V is [BN][D] in the ring,
// i.e. MN-major for this product (the transpose flag of the instruction).
template <class C>
__device__ __forceinline__ void issue_pv(float* o, const uint32_t (*p)[4], uint32_t v_base) {
  const uint64_t vd = make_desc<C::SWB>(v_base, C::BN * C::SWB, 8 * C::SWB);
#pragma unroll
  for (int kk = 0; kk < C::BN / 16; ++kk) {
    const uint64_t dv = desc_advance(vd, kk * 16 * C::SWB);
    Wgmma<C::D>::template rs<C::BF16>(o, p[kk], dv, 1);
  }
}

// Accumulator element e of a 64 x N wgmma tile held by a thread: column
// block e / 4 (8 columns), row half (e / 2) % 2 (+8 rows), column pair e % 2.
template <class C>
__device__ __forceinline__ void mask_tile(float* s, int kv0, int row0, int lane, const AttnArgs& a) {
#pragma unroll
  for (int e = 0; e < C::BN / 2; ++e) {
    const int col = kv0 + (e / 4) * 8 + (lane % 4) * 2 + (e % 2);
    const int row = row0 + ((e / 2) % 2) * 8;
    if (col >= a.sk || (C::CAUSAL && col > row + a.sk - a.sq)) s[e] = NEG_INF;
  }
}

// Online softmax on one tile, in place: s becomes P = exp2(s * scale_log2 -
// m) with m the new running row max (scaled); corr is the factor the earlier
// O and row sums must be multiplied by.
template <class C>
__device__ __forceinline__ void softmax_tile(float* s, float (&row_max)[2], float (&row_sum)[2], float (&corr)[2],
                                             float scale_log2) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float m = row_max[i];
#pragma unroll
    for (int e = 2 * i; e < C::BN / 2; e += 4) m = fmaxf(m, fmaxf(s[e], s[e + 1]));
    m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 2));
    const float m_scaled = (m == NEG_INF) ? 0.f : m * scale_log2;
    corr[i] = fast_exp2(row_max[i] * scale_log2 - m_scaled);
    row_max[i] = m;
    float sum = 0.f;
#pragma unroll
    for (int e = 2 * i; e < C::BN / 2; e += 4) {
      s[e] = fast_exp2(fmaf(s[e], scale_log2, -m_scaled));
      s[e + 1] = fast_exp2(fmaf(s[e + 1], scale_log2, -m_scaled));
      sum += s[e] + s[e + 1];
    }
    row_sum[i] = row_sum[i] * corr[i] + sum;  // this thread's columns only; the quad is summed at the end
  }
}

template <class C>
__device__ __forceinline__ void rescale_o(float* o, const float (&corr)[2]) {
#pragma unroll
  for (int e = 0; e < C::D / 2; ++e) o[e] *= corr[(e / 2) % 2];
}

// The S accumulator of columns 16kk..16kk+15 is exactly the A fragment of
// the k-step kk of P V (wgmma's register A layout matches its D layout).
template <class C>
__device__ __forceinline__ void pack_p(uint32_t (*p)[4], const float* s) {
#pragma unroll
  for (int kk = 0; kk < C::BN / 16; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) p[kk][r] = pack2<C::BF16>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
}

// Ping-pong turns: consumer c issues its tensor-core work after consumer
// c - 1 (cyclically) has issued its own; consumer 0 goes first.
template <class C>
struct Turns {
  int cw;
  __device__ __forceinline__ void start(bool any_work) const {
    if constexpr (C::PINGPONG)
      if (any_work && cw == C::CONSUMERS - 1) named_arrive(1, 256);
  }
  __device__ __forceinline__ void acquire() const {
    if constexpr (C::PINGPONG) named_sync(1 + cw, 256);
  }
  __device__ __forceinline__ void release(bool last) const {
    // The last consumer's final hand-over would have no taker.
    if constexpr (C::PINGPONG)
      if (!(last && cw == C::CONSUMERS - 1)) named_arrive(1 + (cw + 1) % C::CONSUMERS, 256);
  }
};

// ---------------------------------------------------------------- the kernel body

template <class C>
__device__ __forceinline__ void attn_fwd_wgmma(const TmaDesc& tq, const TmaDesc& tk, const TmaDesc& tv,
                                               const AttnArgs& a) {
  using T = typename C::T;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // Swizzled TMA tiles must start on a 1024-byte boundary.
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t sQ = (raw + 1023) & ~1023u;
  const uint32_t sK = sQ + C::Q_BYTES;
  const uint32_t sV = sK + C::STAGES * C::KV_BYTES;
  const uint32_t bars = sV + C::STAGES * C::KV_BYTES;
  // Each consumer's Q rows have their own full/empty pair, so one consumer
  // can start its next work item while another is still finishing.
  auto q_full = [&](int c) { return bars + 8 * c; };
  auto q_empty = [&](int c) { return bars + 8 * (C::CONSUMERS + c); };
  constexpr int KV_BAR0 = 2 * C::CONSUMERS;
  auto k_full = [&](int s) { return bars + 8 * (KV_BAR0 + s); };
  auto v_full = [&](int s) { return bars + 8 * (KV_BAR0 + C::STAGES + s); };
  // K and V slots are freed separately: K as soon as Q K^T has read it.
  auto k_empty = [&](int s) { return bars + 8 * (KV_BAR0 + 2 * C::STAGES + s); };
  auto v_empty = [&](int s) { return bars + 8 * (KV_BAR0 + 3 * C::STAGES + s); };

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  // Work items are (query tile, head, batch): one per CTA (heaviest causal
  // tiles first), or, persistent, about one CTA per SM going through its
  // share of them, so that one item's epilogue overlaps the next one's K/V
  // loads and the other consumers' work. Persistent CTAs take units of consecutive items of
  // one head, strided across the grid: concurrent CTAs share heads (K/V stay
  // in L2). A causal unit pairs query tile q with tile m_blocks - 1 - q:
  // every unit costs about the same, so static striding stays balanced.
  const int m_blocks = (a.sq + C::BM - 1) / C::BM;
  const int unit_items = C::PERSISTENT && C::CAUSAL ? 2 : 1;
  const int units_per_head = C::PERSISTENT && C::CAUSAL ? (m_blocks + 1) / 2 : m_blocks;
  const int n_units = C::PERSISTENT ? units_per_head * a.heads * a.batch : 1;
  struct Work {
    int m0, h, b, n_tiles;
    bool skip;  // the empty second half of a causal unit (the middle tile has no partner)
  };
  // The r-th work item of this CTA; false once it has none left.
  auto work_at = [&](int r, Work& it) {
    int m_block;
    it.skip = false;
    if constexpr (C::PERSISTENT) {
      const int unit = blockIdx.x + r / unit_items * gridDim.x;
      if (unit >= n_units) return false;
      const int hb = unit / units_per_head, q = unit % units_per_head;
      it.h = hb % a.heads;
      it.b = hb / a.heads;
      if constexpr (C::CAUSAL) {
        m_block = r % 2 == 0 ? m_blocks - 1 - q : q;
        it.skip = r % 2 == 1 && q == m_blocks - 1 - q;
      } else {
        m_block = q;
      }
    } else {
      if (r > 0) return false;
      m_block = gridDim.x - 1 - blockIdx.x;
      it.h = blockIdx.y;
      it.b = blockIdx.z;
    }
    it.m0 = m_block * C::BM;
    int kv_end = a.sk;
    if constexpr (C::CAUSAL) kv_end = min(a.sk, max(0, it.m0 + C::BM + a.sk - a.sq));
    it.n_tiles = (kv_end + C::BN - 1) / C::BN;
    return true;
  };

  if (tid == 0) {
    for (int c = 0; c < C::CONSUMERS; ++c) {
      mbar_init(q_full(c), 1);
      mbar_init(q_empty(c), 4);  // lane 0 of each warp of consumer c, after its epilogue
    }
    for (int s = 0; s < C::STAGES; ++s) {
      mbar_init(k_full(s), 1);
      mbar_init(v_full(s), 1);
      mbar_init(k_empty(s), 4 * C::CONSUMERS);
      mbar_init(v_empty(s), 4 * C::CONSUMERS);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    // ---- producer
    if constexpr (C::SPLIT_REGS) setmaxnreg_dec<C::PRODUCER_REGS>();
    // Two loader threads, so that neither waits behind the other: one streams
    // K/V tiles into the ring, the other loads each consumer's Q rows as soon
    // as that consumer has written out its previous item (the epilogue stages
    // O in those rows).
    if (tid == 0) {
      tma_prefetch_map(&tk);
      tma_prefetch_map(&tv);
      int ring = 0;  // K/V tiles loaded so far: slot ring % STAGES, phase (ring / STAGES) & 1
      Work it;
      for (int r = 0; work_at(r, it); ++r) {
        if (it.skip) continue;
        const int hk = it.h / a.h_per_kv;
        for (int j = 0; j < it.n_tiles; ++j, ++ring) {
          const int s = ring % C::STAGES;
          const uint32_t phase = (ring / C::STAGES) & 1;
          mbar_wait(k_empty(s), phase ^ 1);  // a fresh barrier counts as released
          mbar_expect_tx(k_full(s), C::KV_BYTES);
#pragma unroll
          for (int cb = 0; cb < C::CB; ++cb)
            tma_load(sK + s * C::KV_BYTES + cb * C::BN * C::SWB, &tk, k_full(s), cb * C::E, j * C::BN, hk, it.b);
          mbar_wait(v_empty(s), phase ^ 1);
          mbar_expect_tx(v_full(s), C::KV_BYTES);
#pragma unroll
          for (int cb = 0; cb < C::CB; ++cb)
            tma_load(sV + s * C::KV_BYTES + cb * C::BN * C::SWB, &tv, v_full(s), cb * C::E, j * C::BN, hk, it.b);
        }
      }
    } else if (tid == 32) {
      tma_prefetch_map(&tq);
      Work it;
      for (int r = 0, round = 0; work_at(r, it); ++r) {
        if (it.skip) continue;
        for (int c = 0; c < C::CONSUMERS; ++c) {
          mbar_wait(q_empty(c), (round & 1) ^ 1);
          mbar_expect_tx(q_full(c), C::Q_BYTES / C::CONSUMERS);
#pragma unroll
          for (int cb = 0; cb < C::CB; ++cb)
            tma_load(sQ + cb * C::BM * C::SWB + c * C::Q_ROWS * C::SWB, &tq, q_full(c), cb * C::E,
                     it.m0 + c * C::Q_ROWS, it.h, it.b);
        }
        ++round;
      }
    }
    return;
  }

  // ---- consumers
  if constexpr (C::SPLIT_REGS) setmaxnreg_inc<C::CONSUMER_REGS>();
  const int cw = wg - 1;
  const int warp = (tid % 128) / 32, lane = tid % 32;
  const float scale_log2 = a.scale * 1.4426950408889634f;
  const uint32_t q_base = sQ + cw * 64 * C::SWB;
  const Turns<C> turns{cw};
  // The work item holding this CTA's last ping-pong turn (-1: none has any key).
  int last_busy = -1;
  {
    Work it;
    for (int r = 0; work_at(r, it); ++r)
      if (!it.skip && it.n_tiles > 0) last_busy = r;
  }
  turns.start(last_busy >= 0);

  int ring = 0, round = 0;  // K/V tiles consumed so far; items with Q loaded so far
  Work it;
  for (int r = 0; work_at(r, it); ++r) {
    if (it.skip) continue;
    const int m0 = it.m0, n_tiles = it.n_tiles;
    const bool last_work = r == last_busy;
    const int row0 = m0 + cw * 64 + warp * 16 + lane / 4;  // this thread's rows: row0 and row0 + 8

    float o[C::D / 2];
#pragma unroll
    for (int e = 0; e < C::D / 2; ++e) o[e] = 0.f;
    float row_max[2] = {NEG_INF, NEG_INF}, row_sum[2] = {0.f, 0.f}, corr[2];
    float s[C::BN / 2];
    uint32_t p[C::BN / 16][4];

    auto needs_mask = [&](int j) {
      const int kv0 = j * C::BN;
      return kv0 + C::BN > a.sk || (C::CAUSAL && kv0 + C::BN - 1 > m0 + cw * 64 + a.sk - a.sq);
    };
    // Slot and phase of this work item's K/V tile j in the ring.
    auto slot = [&](int j) { return (ring + j) % C::STAGES; };
    auto phase = [&](int j) { return static_cast<uint32_t>(((ring + j) / C::STAGES) & 1); };
    auto release_k = [&](int j) {
      if (lane == 0) mbar_arrive(k_empty(slot(j)));
    };
    auto release_v = [&](int j) {
      if (lane == 0) mbar_arrive(v_empty(slot(j)));
    };

    mbar_wait(q_full(cw), round & 1);
    if constexpr (C::OVERLAP) {
      // Tile j's softmax runs while the tensor cores do P_{j-1} V_{j-1}: Q K_j^T
      // and that product are issued back to back, S_j is waited for first. O is
      // rescaled (for tile j-1's new row max) while Q K_j^T runs, just before
      // P_{j-1} V_{j-1} is issued, as in FlashAttention-3.
      if (n_tiles > 0) {
        mbar_wait(k_full(slot(0)), phase(0));
        turns.acquire();
        wgmma_fence();
        issue_qk<C>(s, q_base, sK + slot(0) * C::KV_BYTES);
        wgmma_commit();
        turns.release(false);
        wgmma_wait<0>();
        fence_regs<C::BN / 2>(s);
        release_k(0);
        if (needs_mask(0)) mask_tile<C>(s, 0, row0, lane, a);
        softmax_tile<C>(s, row_max, row_sum, corr, scale_log2);
        pack_p<C>(p, s);
        for (int j = 1; j < n_tiles; ++j) {
          mbar_wait(k_full(slot(j)), phase(j));
          turns.acquire();
          wgmma_fence();
          issue_qk<C>(s, q_base, sK + slot(j) * C::KV_BYTES);
          wgmma_commit();
          rescale_o<C>(o, corr);
          mbar_wait(v_full(slot(j - 1)), phase(j - 1));
          wgmma_fence();  // o was just written by the rescale
          issue_pv<C>(o, p, sV + slot(j - 1) * C::KV_BYTES);
          wgmma_commit();
          turns.release(false);
          wgmma_wait<1>();
          fence_regs<C::BN / 2>(s);
          release_k(j);
          if (needs_mask(j)) mask_tile<C>(s, j * C::BN, row0, lane, a);
          softmax_tile<C>(s, row_max, row_sum, corr, scale_log2);
          wgmma_wait<0>();
          fence_regs<C::D / 2>(o);
          release_v(j - 1);
          pack_p<C>(p, s);
        }
        mbar_wait(v_full(slot(n_tiles - 1)), phase(n_tiles - 1));
        turns.acquire();
        rescale_o<C>(o, corr);
        wgmma_fence();
        issue_pv<C>(o, p, sV + slot(n_tiles - 1) * C::KV_BYTES);
        wgmma_commit();
        turns.release(last_work);
        wgmma_wait<0>();
        fence_regs<C::D / 2>(o);
        release_v(n_tiles - 1);
      }
    } else {
      for (int j = 0; j < n_tiles; ++j) {
        mbar_wait(k_full(slot(j)), phase(j));
        turns.acquire();
        wgmma_fence();
        issue_qk<C>(s, q_base, sK + slot(j) * C::KV_BYTES);
        wgmma_commit();
        turns.release(false);
        wgmma_wait<0>();
        fence_regs<C::BN / 2>(s);
        release_k(j);
        if (needs_mask(j)) mask_tile<C>(s, j * C::BN, row0, lane, a);
        softmax_tile<C>(s, row_max, row_sum, corr, scale_log2);
        rescale_o<C>(o, corr);
        pack_p<C>(p, s);
        mbar_wait(v_full(slot(j)), phase(j));
        turns.acquire();
        wgmma_fence();
        issue_pv<C>(o, p, sV + slot(j) * C::KV_BYTES);
        wgmma_commit();
        turns.release(last_work && j == n_tiles - 1);
        wgmma_wait<0>();
        fence_regs<C::D / 2>(o);
        release_v(j);
      }
    }
    ring += n_tiles;
    ++round;

    // ---- epilogue: O / l staged in this warpgroup's own Q rows (free once its
    // last Q K^T has completed), then written as whole 16-byte chunks per row.
    // Chunks are XOR-swizzled by row inside each SWB-byte row, so neither the
    // 4-byte fragment stores nor the 16-byte reads conflict on banks.
    constexpr int CPR = C::SWB / 16;  // 16-byte chunks per row of a column block
    uint8_t* stage = smem_raw + (sQ - raw);
    auto chunk_offset = [&](int r, int col) {  // r: row within this warpgroup's 64; col: multiple of 8
      const int cb = col / C::E, chunk = (col % C::E) / 8;
      return cb * C::BM * C::SWB + (cw * 64 + r) * C::SWB + ((chunk ^ (r % CPR)) * 16);
    };
    named_sync(4 + cw, 128);  // every warp of this warpgroup is past its last wgmma
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float l = row_sum[i];
      l += __shfl_xor_sync(0xffffffff, l, 1);
      l += __shfl_xor_sync(0xffffffff, l, 2);
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int r = warp * 16 + lane / 4 + 8 * i;
#pragma unroll
      for (int nb = 0; nb < C::D / 8; ++nb)
        *reinterpret_cast<uint32_t*>(stage + chunk_offset(r, nb * 8) + (lane % 4) * 4) =
            pack2<C::BF16>(o[nb * 4 + 2 * i] * inv, o[nb * 4 + 2 * i + 1] * inv);
      const int row = row0 + 8 * i;
      if (a.lse != nullptr && lane % 4 == 0 && row < a.sq)
        a.lse[((long long)it.b * a.heads + it.h) * a.sq + row] = l > 0.f ? row_max[i] * a.scale + logf(l) : NEG_INF;
    }
    named_sync(4 + cw, 128);
    T* out = reinterpret_cast<T*>(a.o) + it.b * a.o_sb + it.h * a.o_sh;
    constexpr int CHUNKS = 64 * C::D / 8;
#pragma unroll
    for (int idx = tid % 128; idx < CHUNKS; idx += 128) {
      const int r = idx / (C::D / 8), col = idx % (C::D / 8) * 8;
      const int row = m0 + cw * 64 + r;
      if (row < a.sq)
        *reinterpret_cast<uint4*>(out + row * a.o_ss + col) =
            *reinterpret_cast<const uint4*>(stage + chunk_offset(r, col));
    }
    // This warp has read its staged rows: sQ may be reloaded. The next Q is
    // written by TMA (the async proxy) over bytes these threads accessed
    // through the generic proxy, so fence, and gather the lanes, first.
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncwarp();
    if (lane == 0) mbar_arrive(q_empty(cw));
  }
}

}  // namespace fc

// The tuner appends, for one variant:
//   using TunerCfg = fc::HopperConfig<...>;
//   extern "C" __global__ void __launch_bounds__(TunerCfg::THREADS, TunerCfg::MIN_BLOCKS) <name>(ATTN_FWD_PARAMS)
//   { ATTN_FWD_BODY(TunerCfg) }
// The three tensor maps come first (64-byte aligned parameters), then the
// same pointer/stride arguments as the sm_80 template; q, k, v and their
// strides are read through the maps only.
#define ATTN_FWD_PARAMS                                                                                        \
  const __grid_constant__ fc::TmaDesc tmap_q, const __grid_constant__ fc::TmaDesc tmap_k,                      \
      const __grid_constant__ fc::TmaDesc tmap_v, const void *q, const void *k, const void *v, void *o,        \
      float *lse, long long q_sb, long long q_sh, long long q_ss, long long k_sb, long long k_sh,              \
      long long k_ss, long long v_sb, long long v_sh, long long v_ss, long long o_sb, long long o_sh,          \
      long long o_ss, int sq, int sk, int h_per_kv, float scale, int heads, int batch

#define ATTN_FWD_BODY(CFG)                                                     \
  fc::AttnArgs args{o, lse, o_sb, o_sh, o_ss, sq, sk, h_per_kv, scale, heads, batch}; \
  fc::attn_fwd_wgmma<CFG>(tmap_q, tmap_k, tmap_v, args);
