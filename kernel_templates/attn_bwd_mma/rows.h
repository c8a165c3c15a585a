// The backward's two per-row kernels, around the main one: before it, delta = rowsum(dO * O) in fp32, the forward's
// lse in log2 units, and dQ's fp32 accumulator zeroed; after it, dQ converted to the inputs' type. D / 8 lanes of a
// warp take a row, 16 bytes (8 elements) each; a block takes AUX_ROWS rows of one (head, batch).
#pragma once

#include <stdint.h>

#include "../common/utils.h"
#include "args.h"

namespace fc {

// Element (row, col) of (batch b, head h) in dQ's fp32 accumulator. Row-major [B, H, Sq, D]; or, where the template
// says DQ_TILED, [B, H, Sq padded to ROW_PAD] in 64 x 64 blocks (row block, column block), each 4096 floats with
// row r's 8-column group g at group g ^ (r % 8) (so a warp's staging stores to 8 rows hit distinct banks).
// DQ_T (BLOCK_M 80): blocks of 80 rows x 64 columns stored transposed, 64 lines (a column each) of 80 floats,
// line r's 8-row group g at g ^ ((r / 2) % 2) (10 groups: the XOR stays inside; a half-warp's 8-byte staging
// stores to 4 lines then hit distinct banks).
template <class C>
__device__ __forceinline__ long long dq_index(const BwdArgs& a, int b, int h, int row, int col) {
  const long long bh = (long long)b * a.heads + h;
  if constexpr (C::DQ_T) {
    const int sq_pad = (a.sq + C::ROW_PAD - 1) / C::ROW_PAD * C::ROW_PAD;
    const long long block = (bh * (sq_pad / C::BM) + row / C::BM) * (C::D / 64) + col / 64;
    const int r = col % 64, c = row % C::BM;
    return block * (64 * C::BM) + r * C::BM + (((c / 8) ^ ((r / 2) % 2)) * 8) + c % 8;
  } else if constexpr (C::DQ_TILED) {
    const int sq_pad = (a.sq + C::ROW_PAD - 1) / C::ROW_PAD * C::ROW_PAD;
    const long long block = (bh * (sq_pad / 64) + row / 64) * (C::D / 64) + col / 64;
    const int r = row % 64, c = col % 64;
    return block * 4096 + r * 64 + (((c / 8) ^ (r % 8)) * 8) + c % 8;
  }
  return (bh * a.sq + row) * C::D + col;
}

// Row `row` of (batch b, head h) in the lse_log2 and delta vectors, whose rows are padded to ROW_PAD (sq_pad).
__device__ __forceinline__ long long padded_row(const BwdArgs& a, int b, int h, int row, int sq_pad) {
  return ((long long)b * a.heads + h) * sq_pad + row;
}

// Per row r of (b, h), r < ROW_PAD-padded Sq: lse_log2 = lse * log2(e) (+inf where lse is -inf or r >= Sq: such a row
// gets P = 0 everywhere), delta = sum_d dO * O (0 past Sq); dq_accum's row zeroed (r < Sq; DQ_T: the (b, h)'s
// padded slab zeroed in flat order, every row < padded Sq, since its elements are scattered over all of it).
template <class C>
__device__ __forceinline__ void bwd_dot_do_o(const BwdArgs& a) {
  using T = typename C::T;
  constexpr int LANES = C::D / 8;
  const int h = blockIdx.y, b = blockIdx.z;
  const int row = blockIdx.x * C::AUX_ROWS + (int)threadIdx.x / LANES, c = ((int)threadIdx.x % LANES) * 8;
  const int sq_pad = (a.sq + C::ROW_PAD - 1) / C::ROW_PAD * C::ROW_PAD;
  float dot = 0.f;
  if (row < a.sq) {
    const uint4 ov = *reinterpret_cast<const uint4*>(static_cast<const T*>(a.o) + b * a.o_sb + h * a.o_sh +
                                                     row * a.o_ss + c);
    const uint4 dv = *reinterpret_cast<const uint4*>(static_cast<const T*>(a.dout) + b * a.do_sb + h * a.do_sh +
                                                     row * a.do_ss + c);
    const T* oe = reinterpret_cast<const T*>(&ov);
    const T* de = reinterpret_cast<const T*>(&dv);
#pragma unroll
    for (int i = 0; i < 8; ++i) dot = fmaf(static_cast<float>(oe[i]), static_cast<float>(de[i]), dot);
    if constexpr (!C::DQ_T) {
      float4* acc = reinterpret_cast<float4*>(a.dq_accum + dq_index<C>(a, b, h, row, c));  // 8 contiguous floats
      acc[0] = make_float4(0.f, 0.f, 0.f, 0.f);
      acc[1] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  if constexpr (C::DQ_T) {
    if (row < sq_pad) {
      float4* acc = reinterpret_cast<float4*>(a.dq_accum + (((long long)b * a.heads + h) * sq_pad + row) * C::D + c);
      acc[0] = make_float4(0.f, 0.f, 0.f, 0.f);
      acc[1] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
#pragma unroll
  for (int off = LANES / 2; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffff, dot, off);
  if (row < sq_pad && c == 0) {
    const long long at = padded_row(a, b, h, row, sq_pad);
    const float l = row < a.sq ? a.lse[((long long)b * a.heads + h) * a.sq + row] : NEG_INF;
    a.lse_log2[at] = l == NEG_INF ? -NEG_INF : l * LOG2E;
    a.delta[at] = dot;
  }
}

// dQ = scale * dq_accum, in the inputs' type, at dQ's strides. DQ_T: thread d of the block converts column d of
// its AUX_ROWS (8) rows, one 8-row group of a transposed block: 32 contiguous bytes.
template <class C>
__device__ __forceinline__ void bwd_dq_convert(const BwdArgs& a) {
  using T = typename C::T;
  constexpr int LANES = C::D / 8;
  const int h = blockIdx.y, b = blockIdx.z;
  if constexpr (C::DQ_T) {
    static_assert(C::AUX_THREADS == C::D && C::AUX_ROWS == 8 && C::BM % 8 == 0, "a thread per column, 8 rows");
    const int row0 = blockIdx.x * 8, d = threadIdx.x;
    const float4* acc = reinterpret_cast<const float4*>(a.dq_accum + dq_index<C>(a, b, h, row0, d));
    const float4 x = acc[0], y = acc[1];
    const float v[8] = {x.x, x.y, x.z, x.w, y.x, y.y, y.z, y.w};
    T* out = static_cast<T*>(a.dq) + b * a.dq_sb + h * a.dq_sh + d;
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (row0 + i < a.sq) out[(long long)(row0 + i) * a.dq_ss] = static_cast<T>(v[i] * a.scale);
    return;
  }
  const int row = blockIdx.x * C::AUX_ROWS + (int)threadIdx.x / LANES, c = ((int)threadIdx.x % LANES) * 8;
  if (row >= a.sq) return;
  const float4* acc = reinterpret_cast<const float4*>(a.dq_accum + dq_index<C>(a, b, h, row, c));
  const float4 x = acc[0], y = acc[1];
  const float s = a.scale;
  *reinterpret_cast<uint4*>(static_cast<T*>(a.dq) + b * a.dq_sb + h * a.dq_sh + row * a.dq_ss + c) =
      make_uint4(pack2<T>(x.x * s, x.y * s), pack2<T>(x.z * s, x.w * s), pack2<T>(y.x * s, y.y * s),
                 pack2<T>(y.z * s, y.w * s));
}

}  // namespace fc
