// An FP8 (e4m3) KV cache in the decode templates: the K and V fragments widened to fp16 in registers, and
// Q stored as fp16 to meet them. e4m3 -> fp16 is exact (cvt.rn.f16x2.e4m3x2), so both products run as
// fp16 mma.sync with fp32 accumulators and the only error beyond the 16-bit kernel's is P's fp16 rounding.
// The cache's scales (real = stored x scale, per batch row and K/V head) never touch the tile: K's joins the
// softmax scale, V's multiplies O once at the end (finish_rows).
//
// No transposes: the fragments are loaded in orders the dot products do not care about.
//  - S = Q K^T sums over the head dim: one ldmatrix row of K is 16 e4m3 = a whole k16 slice, and lane t gets
//    dims 4t .. 4t+3 of it, which it gives as the mma's k 2t, 2t+1 (dims 4t, 4t+1) and k 2t+8, 2t+9
//    (4t+2, 4t+3). Q's columns are stored in that order (load_packed_q_fp16), so ldmatrix gives the match.
//  - O += P V sums over the keys (the lane's P keys 2t, 2t+1, 2t+8, 2t+9 of each 16) and its output columns
//    are ours to name: lane (g, t) supplies column n = g of n8 tile j in a 32-dim group as dim 4g + j, so one
//    32-bit load of a key row holds its bytes for all four tiles; a byte permute pairs two keys, a cvt widens.
//    O's dims are then permuted (o_col), undone when the warps merge in shared memory.
#pragma once

#include "../common/ptx_sm80.h"
#include "../common/warp_tile.h"
#include "../common/attn_args.h"
#include "../common/utils.h"
#include "rows.h"

namespace fc {

// Four e4m3 (a 32-bit register, byte 0 first) widened to two f16x2: bytes 0-1 -> lo, bytes 2-3 -> hi.
__device__ __forceinline__ void e4m3x4_to_f16(uint32_t w, uint32_t& lo, uint32_t& hi) {
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
}

__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}

template <class T>
__device__ __forceinline__ float2 unpack2(uint32_t w);
template <>
__device__ __forceinline__ float2 unpack2<half>(uint32_t w) {
  return __half22float2(*reinterpret_cast<const __half2*>(&w));
}
template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t w) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
}

// The head dim that O accumulator [dt] element e (of the lane with quad index t) holds.
template <class C>
__device__ __forceinline__ int o_col(int dt, int t, int e) {
  if constexpr (C::KV_FP8) return (dt / 4) * 32 + 8 * t + 4 * e + (dt % 4);
  else return dt * 8 + 2 * t + e;
}

// Q rows r0 .. r0 + BM of the packed (position, head) order into the tile as fp16 times 2^e, e chosen from
// the block's largest |q| so that it lands in [2^14, 2^15): no fp16 overflow, and bf16's 8 significant bits
// stay exact down to 2^-14 of the largest value. Each 16-column block's columns are stored in the order the
// K fragments give the dims (k 2t, 2t+1 <- dims 4t, 4t+1; k 2t+8, 2t+9 <- 4t+2, 4t+3). warp_max: NUM_WARPS
// floats of shared memory. Returns 2^-e (for the softmax scale). Rows past the problem are zero.
template <class C>
__device__ __forceinline__ float load_packed_q_fp16(half* sQ, const AttnArgs& a, int b, int hk, int r0, int rows,
                                                    float* warp_max) {
  using T = typename C::T;
  constexpr int CHUNKS = C::D / 16;  // 16 columns (two 16-byte loads) a step
  auto row_ptr = [&](int gr) {
    const int p = row_position(gr, a.h_per_kv), h = hk * a.h_per_kv + row_head(gr, a.h_per_kv);
    return static_cast<const T*>(a.q) + b * a.q_sb + h * a.q_sh + p * a.q_ss;
  };
  float mx = 0.f;
  for (int i = threadIdx.x; i < C::BM * CHUNKS; i += C::THREADS) {
    const int gr = r0 + i / CHUNKS, c = (i % CHUNKS) * 16;
    if (gr >= rows) continue;
    const uint4* src = reinterpret_cast<const uint4*>(row_ptr(gr) + c);
    const uint4 w[2] = {src[0], src[1]};
    const uint32_t* ws = reinterpret_cast<const uint32_t*>(w);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float2 f = unpack2<T>(ws[k]);
      mx = fmaxf(mx, fmaxf(fabsf(f.x), fabsf(f.y)));
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, off));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = mx;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < C::NUM_WARPS; ++w) mx = fmaxf(mx, warp_max[w]);
  // 14 - floor(log2 mx) from the exponent bits, kept where 2^e and 2^-e are normal floats; 0 for an all-zero
  // (or non-finite: it propagates as the reference's would) block.
  int e = 0;
  if (mx > 0.f && mx <= 3.4e38f) e = min(max(14 - ((__float_as_int(mx) >> 23) - 127), -113), 100);
  const float up = __int_as_float((127 + e) << 23);
  for (int i = threadIdx.x; i < C::BM * CHUNKS; i += C::THREADS) {
    const int r = i / CHUNKS, c = (i % CHUNKS) * 16;
    uint32_t out[8] = {0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u};  // dims (0,1) (4,5) (8,9) (12,13) | (2,3) (6,7) ...
    if (r0 + r < rows) {
      const uint4* src = reinterpret_cast<const uint4*>(row_ptr(r0 + r) + c);
      const uint4 w[2] = {src[0], src[1]};
      const uint32_t* ws = reinterpret_cast<const uint32_t*>(w);
#pragma unroll
      for (int k = 0; k < 8; ++k) {  // word k holds dims 2k, 2k+1
        const float2 f = unpack2<T>(ws[k]);
        out[(k % 2) * 4 + k / 2] = pack2<half>(f.x * up, f.y * up);
      }
    }
    *reinterpret_cast<uint4*>(sQ + C::QLayout::offset(r, c)) = make_uint4(out[0], out[1], out[2], out[3]);
    *reinterpret_cast<uint4*>(sQ + C::QLayout::offset(r, c + 8)) = make_uint4(out[4], out[5], out[6], out[7]);
  }
  return __int_as_float((127 - e) << 23);
}

// S = Q K^T for an e4m3 K tile (ldmatrix as 16-bit pairs: a lane gets 4 dims of one key, see the top).
template <class C>
__device__ __forceinline__ void warp_qk_kv8(float (&acc_s)[C::MT][C::NT][4], uint32_t q_rb, uint32_t q_cb,
                                            uint32_t k_rb, uint32_t k_cb) {
  using QL = typename C::QLayout;
  using KL = typename C::KVLayout;
  zero_acc(acc_s);
#pragma unroll
  for (int kc = 0; kc < C::D / 32; ++kc) {  // 32 dims: two k16 slices
    uint32_t a_frag[2][C::MT][4];
#pragma unroll
    for (int s = 0; s < 2; ++s)
#pragma unroll
      for (int mt = 0; mt < C::MT; ++mt) ldmatrix_x4(a_frag[s][mt], QL::addr(q_rb, q_cb, mt * 16, kc * 32 + s * 16));
#pragma unroll
    for (int np = 0; np < C::NT / 2; ++np) {
      uint32_t k8[4];  // keys 0-7 slice 0, keys 0-7 slice 1, keys 8-15 slice 0, keys 8-15 slice 1
      ldmatrix_x4(k8, KL::addr(k_rb, k_cb, np * 16, kc * 32));
#pragma unroll
      for (int f = 0; f < 4; ++f) {
        uint32_t b0, b1;
        e4m3x4_to_f16(k8[f], b0, b1);
#pragma unroll
        for (int mt = 0; mt < C::MT; ++mt) Mma<half>::run(acc_s[mt][2 * np + f / 2], a_frag[f % 2][mt], b0, b1);
      }
    }
  }
}

// O += P V for an e4m3 V tile. v_rb / v_cb: the lane's byte address of its key row key_base + 2t and the
// swizzled offset of its dims 4(g % 4) .. + 3 in chunk g / 4 (row 2t + 1's: + one row, chunk bit 0 flipped).
template <class C>
__device__ __forceinline__ void warp_pv_kv8(float (&acc_o)[C::MT][C::DT][4], const float (&acc_s)[C::MT][C::NT][4],
                                            uint32_t v_rb, uint32_t v_cb) {
  using KL = typename C::KVLayout;
#pragma unroll
  for (int kk = 0; kk < C::NT / 2; ++kk) {
    uint32_t p_frag[C::MT][4];
    pack_p_frag<half>(p_frag, acc_s, kk);
#pragma unroll
    for (int grp = 0; grp < C::D / 32; ++grp) {
      // Keys 2t, 2t+1, 2t+8, 2t+9 of this 16, dims 4g .. 4g+3 of the group.
      const uint32_t w0 = lds32(KL::addr(v_rb, v_cb, kk * 16, grp * 32));
      const uint32_t w1 = lds32(KL::addr(v_rb + KL::ROW_BYTES, v_cb ^ 16u, kk * 16, grp * 32));
      const uint32_t w2 = lds32(KL::addr(v_rb, v_cb, kk * 16 + 8, grp * 32));
      const uint32_t w3 = lds32(KL::addr(v_rb + KL::ROW_BYTES, v_cb ^ 16u, kk * 16 + 8, grp * 32));
      uint32_t b[4][2];  // tile j: (keys 2t, 2t+1), (keys 2t+8, 2t+9) at dim 4g + j
      e4m3x4_to_f16(__byte_perm(w0, w1, 0x5140), b[0][0], b[1][0]);
      e4m3x4_to_f16(__byte_perm(w2, w3, 0x5140), b[0][1], b[1][1]);
      e4m3x4_to_f16(__byte_perm(w0, w1, 0x7362), b[2][0], b[3][0]);
      e4m3x4_to_f16(__byte_perm(w2, w3, 0x7362), b[2][1], b[3][1]);
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int mt = 0; mt < C::MT; ++mt) Mma<half>::run(acc_o[mt][grp * 4 + j], p_frag[mt], b[j][0], b[j][1]);
    }
  }
}

}  // namespace fc
