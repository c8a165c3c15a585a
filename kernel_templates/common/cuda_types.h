// The CUDA element types the templates name (half, __nv_bfloat16, __nv_fp8_e4m3) and the conversions they
// call, from the toolkit's cuda_fp16.h, cuda_bf16.h and cuda_fp8.h.
//
// The tuner's own compiles define FC_LITE_CUDA_TYPES (tuner/kernels/compiler.py): then this header declares
// just those, with the toolkit headers' layouts and the very asm their device paths emit, because parsing
// the three headers is about 0.16 CPU-s of a ~1 s compile (gcc -E and cicc's front end), and a search
// compiles hundreds of variants. The cubin is byte-for-byte the one the toolkit headers give
// (tests/test_lite_cuda_types.py compiles variants both ways). A user's own build (header export,
// tuner render without the option) gets the toolkit headers, so the types are CUDA's own. Copy the
// toolkit's device code as it is, calls and copies included: a shortcut that computes the same values can
// still move instructions (a defaulted bf16x2 copy did), and the test then fails.
#pragma once

#ifndef FC_LITE_CUDA_TYPES
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#else
#if defined(__CUDA_FP16_H__) || defined(__CUDA_BF16_H__) || defined(__CUDA_FP8_H__)
#error "FC_LITE_CUDA_TYPES: a toolkit cuda_fp16/bf16/fp8 header is included too; compile without the option"
#endif

static __device__ __inline__ float __internal_device_bfloat162float(const unsigned short h) {
  float f;
#if __CUDA_ARCH__ >= 900
  asm("{ cvt.f32.bf16 %0, %1;}\n" : "=f"(f) : "h"(h));
#else
  asm("{ mov.b32 %0, {0,%1};}\n" : "=f"(f) : "h"(h));
#endif
  return f;
}
static __device__ __inline__ float __internal_bfloat162float(const unsigned short h) {
  return __internal_device_bfloat162float(h);
}
struct __nv_bfloat162_raw {
  unsigned short x, y;
};

struct __align__(2) __half {
  unsigned short __x;
  __half() = default;
  __device__ inline __half(const float f);  // __float2half, below
  __device__ inline operator float() const {  // __half2float
    float val;
    asm("{  cvt.f32.f16 %0, %1;}\n" : "=f"(val) : "h"(*reinterpret_cast<const unsigned short*>(this)));
    return val;
  }
};
typedef __half half;
struct __align__(4) __half2 {
  __half x, y;
  // Copies as the toolkit's device path does (one 32-bit move; a defaulted copy gave a different schedule).
  __half2() = default;
  __device__ inline __half2(const __half2& src) {
    *reinterpret_cast<unsigned int*>(this) = *reinterpret_cast<const unsigned int*>(&src);
  }
  __device__ inline __half2& operator=(const __half2& src) {
    *reinterpret_cast<unsigned int*>(this) = *reinterpret_cast<const unsigned int*>(&src);
    return *this;
  }
};
struct __align__(2) __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  __device__ inline __nv_bfloat16(const float f);  // __float2bfloat16, below
  __device__ inline operator float() const { return __internal_bfloat162float(__x); }  // __bfloat162float
};
struct __align__(4) __nv_bfloat162 {
  __nv_bfloat16 x, y;
  // As __half2's.
  __nv_bfloat162() = default;
  __device__ inline __nv_bfloat162(const __nv_bfloat162& src) {
    *reinterpret_cast<unsigned int*>(this) = *reinterpret_cast<const unsigned int*>(&src);
  }
  __device__ inline __nv_bfloat162& operator=(const __nv_bfloat162& src) {
    *reinterpret_cast<unsigned int*>(this) = *reinterpret_cast<const unsigned int*>(&src);
    return *this;
  }
  __device__ inline operator __nv_bfloat162_raw() const {  // its device path
    __nv_bfloat162_raw ret;
    ret.x = 0U;
    ret.y = 0U;
    *reinterpret_cast<unsigned int*>(&ret) = *reinterpret_cast<const unsigned int*>(this);
    return ret;
  }
};
struct __align__(1) __nv_fp8_e4m3 {
  unsigned char __x;
};
typedef unsigned short __nv_fp8x2_storage_t;
enum __nv_saturation_t { __NV_NOSAT, __NV_SATFINITE };
enum __nv_fp8_interpretation_t { __NV_E4M3, __NV_E5M2 };

// The toolkit's device paths for sm_80 and later (the templates' archs), asm strings unchanged.
static __device__ __inline__ __half __float2half(const float a) {
  __half val;
  asm("{  cvt.rn.f16.f32 %0, %1;}\n" : "=h"(*reinterpret_cast<unsigned short*>(&val)) : "f"(a));
  return val;
}
__device__ inline __half::__half(const float f) { __x = __float2half(f).__x; }

static __device__ __inline__ __nv_bfloat16 __float2bfloat16(const float a) {
  __nv_bfloat16 val;
  asm("{  cvt.rn.bf16.f32 %0, %1;}\n" : "=h"(*reinterpret_cast<unsigned short*>(&val)) : "f"(a));
  return val;
}
__device__ inline __nv_bfloat16::__nv_bfloat16(const float f) { __x = __float2bfloat16(f).__x; }

static __device__ __inline__ __half2 __floats2half2_rn(const float a, const float b) {
  __half2 val;
  asm("{ cvt.rn.f16x2.f32 %0, %2, %1; }\n" : "=r"(*reinterpret_cast<unsigned int*>(&val)) : "f"(a), "f"(b));
  return val;
}

static __device__ __inline__ __nv_bfloat162 __floats2bfloat162_rn(const float a, const float b) {
  __nv_bfloat162 val;
  asm("{ cvt.rn.bf16x2.f32 %0, %2, %1;}\n" : "=r"(*reinterpret_cast<unsigned int*>(&val)) : "f"(a), "f"(b));
  return val;
}

// Saturating only (the templates' one use; the constant arguments fold away): cuda_fp8.hpp's non-saturating
// path is a software rounding this header leaves out, so asking for it traps instead of saturating.
static __device__ __inline__ __nv_fp8x2_storage_t __nv_cvt_float2_to_fp8x2(
    const float2 x, const __nv_saturation_t saturate, const __nv_fp8_interpretation_t interpretation) {
  if (saturate != __NV_SATFINITE) __trap();
  __nv_fp8x2_storage_t storage;
  if (interpretation == __NV_E5M2)
    asm("{cvt.rn.satfinite.e5m2x2.f32 %0, %2, %1;}\n" : "=h"(storage) : "f"(x.x), "f"(x.y));
  else
    asm("{cvt.rn.satfinite.e4m3x2.f32 %0, %2, %1;}\n" : "=h"(storage) : "f"(x.x), "f"(x.y));
  return storage;
}

static __device__ __inline__ float2 __half22float2(const __half2 a) {
  float hi_float, lo_float;
  asm("{.reg .f16 low,high;\n"
      "  mov.b32 {low,high},%1;\n"
      "  cvt.f32.f16 %0, low;}\n" : "=f"(lo_float) : "r"(*reinterpret_cast<const unsigned int*>(&a)));
  asm("{.reg .f16 low,high;\n"
      "  mov.b32 {low,high},%1;\n"
      "  cvt.f32.f16 %0, high;}\n" : "=f"(hi_float) : "r"(*reinterpret_cast<const unsigned int*>(&a)));
  return make_float2(lo_float, hi_float);
}

static __device__ __inline__ float2 __bfloat1622float2(const __nv_bfloat162 a) {
  float hi_float;
  float lo_float;
  lo_float = __internal_bfloat162float(((__nv_bfloat162_raw)a).x);
  hi_float = __internal_bfloat162float(((__nv_bfloat162_raw)a).y);
  return make_float2(lo_float, hi_float);
}
#endif
