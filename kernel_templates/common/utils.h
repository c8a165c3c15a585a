// Device helpers both attention templates use: shared-memory addresses,
// exp2 on the SFU, fp32 -> 16-bit packing, and constants.
#pragma once

#include <stdint.h>

#include "cuda_types.h"

namespace fc {

constexpr float NEG_INF = -__builtin_huge_valf();
constexpr float LOG2E = 1.4426950408889634f;  // softmax in base 2: exp(x) = exp2(x * LOG2E)
constexpr float LN2 = 0.6931471805599453f;

// The 32-bit shared-window address PTX shared-memory instructions take.
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 2^x on the special-function unit, flushing denormals: exp2f() adds range
// fix-ups around the same instruction that softmax does not need.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// 1/x and log2(x) on the special-function unit, flushing denormals: __fdividef and __logf add a
// denormal-range rescale around each (an epilogue's row sum l >= 1 never needs it).
__device__ __forceinline__ float fast_rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two fp32 values rounded to T (half or __nv_bfloat16) in one 32-bit
// register, `lo` in the low half: the layout of an mma/wgmma A fragment.
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t pack2<half>(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

// Four fp32 values rounded to e4m3 (saturating) in one 32-bit register, a0 in the lowest byte: one
// FP8 wgmma A-fragment register.
__device__ __forceinline__ uint32_t pack4_e4m3(float a0, float a1, float a2, float a3) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a0, a1), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(a2, a3), __NV_SATFINITE, __NV_E4M3);
  return lo | (hi << 16);
}

}  // namespace fc
