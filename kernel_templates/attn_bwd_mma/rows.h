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
template <class C>
__device__ __forceinline__ long long dq_index(const BwdArgs& a, int b, int h, int row, int col) {
  const long long bh = (long long)b * a.heads + h;
  if constexpr (C::DQ_TILED) {
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
// gets P = 0 everywhere), delta = sum_d dO * O (0 past Sq); dq_accum's row zeroed (r < Sq).
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
    float4* acc = reinterpret_cast<float4*>(a.dq_accum + dq_index<C>(a, b, h, row, c));  // 8 contiguous floats
    acc[0] = make_float4(0.f, 0.f, 0.f, 0.f);
    acc[1] = make_float4(0.f, 0.f, 0.f, 0.f);
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

// dQ = scale * dq_accum, in the inputs' type, at dQ's strides.
template <class C>
__device__ __forceinline__ void bwd_dq_convert(const BwdArgs& a) {
  using T = typename C::T;
  constexpr int LANES = C::D / 8;
  const int h = blockIdx.y, b = blockIdx.z;
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
