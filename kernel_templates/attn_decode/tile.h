// The math of the decode templates, whatever brings the K/V tiles (TMA on
// sm_90, cp.async on sm_80) and however the split CTAs merge (a cluster's
// distributed shared memory, or a workspace in global memory): the packed Q
// rows, one K/V tile's online-softmax step per warp, the merge of the warps
// in shared memory, and the rows' final merge over the splits.
#pragma once

#include "../common/ptx_sm80.h"
#include "../common/warp_tile.h"
#include "../common/attn_args.h"
#include "../common/utils.h"
#include "config.h"
#include "kv_fp8.h"
#include "rows.h"

namespace fc {

// A paged K/V cache (vLLM's layout): K and V are [pages, page, Hkv, D]; sequence b's key n lives in page
// table[b * per_seq + n / page], row n % page. The tensor maps then cover the pages as [pages, Hkv, page, D]
// with boxes of min(BN, page) rows (page: a power of two >= 16, so a box never crosses a page and starts
// on the 128-byte swizzle's 1024-byte period). table == nullptr: the dense layout. The page size comes as
// its log2: shifts, not divisions, in the loop (the larger tiles have no register to spare).
struct Paging {
  const int* table;
  int page_shift, per_seq;
};

// A CTA's keys: those its block's query positions see (bottom-right alignment; causal and a window bound
// them: common/mask.h), up to n_end, cut in whole BN-key tiles from the first the window reaches; split s of
// SPLITS takes tiles j0 .. j0 + n_tiles (absolute tile indices).
struct CtaKeys {
  int n_end, j0, n_tiles;
};

template <class C>
__device__ __forceinline__ CtaKeys key_range(int sk, int sq, int group, int m0, int split) {
  const int rows = group * sq, diag = sk - sq;
  // min(rows, m0 + BM) >= 1: the grid's row blocks start below rows
  const int p_lo = row_position(m0, group) + diag, p_hi = row_position(min(rows, m0 + C::BM) - 1, group) + diag;
  const int n_end = C::Keys::end(p_hi, sk);
  // Unsigned (shifts, no sign fix-ups): first() and n_end are >= 0, tiles_all too.
  const int t0 = (int)((unsigned)C::Keys::first(p_lo) / C::BN);
  const int tiles_all = max(0, (int)((unsigned)(n_end + C::BN - 1) / C::BN) - t0);
  const int per_split = (int)((unsigned)(tiles_all + C::SPLITS - 1) / C::SPLITS);
  const int j0 = split * per_split;
  return CtaKeys{n_end, t0 + j0, max(0, min(tiles_all, j0 + per_split) - j0)};
}

// Q rows r0 .. r0 + BM of the packed (position, head) order into the tile;
// rows past the problem are zero (their scores are finite and never stored).
template <class C>
__device__ __forceinline__ void load_packed_q(typename C::T* sQ, const AttnArgs& a, int b, int hk, int r0,
                                              int rows) {
  using T = typename C::T;
  constexpr int CHUNKS = C::D / 8;
  for (int i = threadIdx.x; i < C::BM * CHUNKS; i += C::THREADS) {
    const int r = i / CHUNKS, c = (i % CHUNKS) * 8;
    const int gr = r0 + r;
    uint4 val = make_uint4(0u, 0u, 0u, 0u);
    if (gr < rows) {
      const int p = row_position(gr, a.h_per_kv), h = hk * a.h_per_kv + row_head(gr, a.h_per_kv);
      val = *reinterpret_cast<const uint4*>(static_cast<const T*>(a.q) + b * a.q_sb + h * a.q_sh + p * a.q_ss + c);
    }
    *reinterpret_cast<uint4*>(sQ + C::QLayout::offset(r, c)) = val;
  }
}

// Where the block's rows and this lane sit: fixed for the whole key loop.
struct TilePlace {
  int m0, group, diag, p_first, p_last, n_end, key_base, g, t;  // p_first/p_last: the block's query positions
  float scale_log2, cap_pre;  // softmax scale (log2 units; a softcap's when there is one), the pre-tanh scale
};

// A block's TilePlace: rows m0 .. m0 + BM of `rows` packed ones, the softcap folded into the scale.
template <class C>
__device__ __forceinline__ TilePlace tile_place(int m0, int group, int rows, int diag, int n_end, int key_base,
                                                int g, int t, float scale) {
  return TilePlace{m0, group, diag, row_position(m0, group), row_position(min(rows, m0 + C::BM) - 1, group), n_end,
                   key_base, g, t,
                   C::Cap::softmax_scale(scale) * LOG2E, C::Cap::pre_scale(scale)};
}

// One K/V tile (keys n0 .. n0 + BN) for this warp's keys: S = Q K^T (ldmatrix + mma.sync), the masks
// (keys past n_end, and past each row's causal limit), the online softmax, O += P V. tk_rb / tv_rb: the
// lane's K and V row bases in the tile's shared memory (k_cb / v_cb their swizzled chunks; an FP8 cache's V:
// warp_pv_kv8's).
template <class C>
__device__ __forceinline__ void decode_tile(WarpState<C>& st, const TilePlace& at, uint32_t q_rb, uint32_t q_cb,
                                            uint32_t tk_rb, uint32_t k_cb, uint32_t tv_rb, uint32_t v_cb, int n0) {
  using T = typename C::T;
  using QL = typename C::QLayout;
  using KL = typename C::KVLayout;
  const int g = at.g, t = at.t;

  // ---- S = Q K^T: every row of the block x this warp's keys of the tile
  float acc_s[C::MT][C::NT][4];
  if constexpr (C::KV_FP8) {
    warp_qk_kv8<C>(acc_s, q_rb, q_cb, tk_rb, k_cb);
  } else {
    warp_qk<T, KL, C::MT, C::NT, C::KD>(
        acc_s, [&](uint32_t(&f)[4], int mt, int kd) { ldmatrix_x4(f, QL::addr(q_rb, q_cb, mt * 16, kd * 16)); },
        tk_rb, k_cb);
  }

  C::Cap::template apply<C::MT * C::NT * 4>(&acc_s[0][0][0], at.cap_pre);  // softcap (before the masks)

  // ---- masks: keys past the end, and outside each row's causal limit or window
  if (C::Keys::partial(n0, C::BN, at.p_first + at.diag, at.p_last + at.diag, at.n_end))
    warp_mask<typename C::Keys>(acc_s, n0 + at.key_base, g, t, at.n_end,
                                [&](int row) { return row_position(at.m0 + row, at.group) + at.diag; });

  // ---- online softmax, then O += P V
#pragma unroll
  for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float alpha = warp_softmax_row<C::NT>(acc_s[mt], r, st.row_max[mt][r], st.row_sum[mt][r], at.scale_log2);
#pragma unroll
      for (int dt = 0; dt < C::DT; ++dt) {
        st.acc_o[mt][dt][2 * r] *= alpha;
        st.acc_o[mt][dt][2 * r + 1] *= alpha;
      }
    }
  if constexpr (C::KV_FP8) warp_pv_kv8<C>(st.acc_o, acc_s, tv_rb, v_cb);
  else warp_pv<T, KL, C::MT, C::NT, C::DT>(st.acc_o, acc_s, tv_rb, v_cb);
}

// The CTA's partial result in shared memory (the K/V ring reused: call after every warp is done with it):
// O [BM][D] fp32, unnormalised, relative to the CTA's row max; the row max (log2 units, -inf: no key) and
// the row sum relative to it.
template <class C>
struct CtaPartial {
  float* acc;  // [BM][D]
  float* m;    // [BM]
  float* l;    // [BM]
};

// One warp's share of one O row (its element pair r of every n8 tile, times `factor`) stored to (first) or added
// into the row's fp32 sums in shared memory, 16 bytes at a time where the dims allow it.
template <class C>
__device__ __forceinline__ void add_o_row(float* dst_row, const float (&acc)[C::DT][4], int r, float factor, int t,
                                          bool first) {
  auto put = [&](auto* dst, auto mine) {
    if (first) {
      *dst = mine;
    } else {
      auto sum = *dst;
      sum.x += mine.x, sum.y += mine.y;
      if constexpr (sizeof(mine) == 16) sum.z += mine.z, sum.w += mine.w;
      *dst = sum;
    }
  };
  if constexpr (C::KV_FP8) {  // the dims are permuted (o_col): tiles 4q .. 4q+3's element e are four adjacent dims
#pragma unroll
    for (int q = 0; q < C::DT / 4; ++q)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        put(reinterpret_cast<float4*>(dst_row + o_col<C>(4 * q, t, e)),
            make_float4(acc[4 * q][2 * r + e] * factor, acc[4 * q + 1][2 * r + e] * factor,
                        acc[4 * q + 2][2 * r + e] * factor, acc[4 * q + 3][2 * r + e] * factor));
  } else {
#pragma unroll
    for (int dt = 0; dt < C::DT; ++dt)
      put(reinterpret_cast<float2*>(dst_row + dt * 8 + 2 * t),
          make_float2(acc[dt][2 * r] * factor, acc[dt][2 * r + 1] * factor));
  }
}

template <class C>
__device__ __forceinline__ CtaPartial<C> merge_warps(WarpState<C>& st, unsigned char* smem_raw, const TilePlace& at,
                                                     int warp, int rows) {
  const int g = at.g, t = at.t;
  st.quad_sums();
  float* s_acc = reinterpret_cast<float*>(smem_raw + C::Q_BYTES);  // [BM][D]
  float* s_wmax = s_acc + C::BM * C::D;                            // [NUM_WARPS][BM]
  float* s_wsum = s_wmax + C::NUM_WARPS * C::BM;                   // [NUM_WARPS][BM]
  float* s_m = s_wsum + C::NUM_WARPS * C::BM;
  float* s_l = s_m + C::BM;
#pragma unroll
  for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      if (t == 0) {
        const int row = mt * 16 + g + r * 8;
        s_wmax[warp * C::BM + row] = st.row_max[mt][r];
        s_wsum[warp * C::BM + row] = st.row_sum[mt][r];
      }
  __syncthreads();
  // Each warp's O, rescaled to the CTA's row max, added to s_acc one warp after the other: shared-memory
  // atomics from every warp on the same addresses serialised and cost more than the whole key loop at
  // B8 Sk8192 (the first version: 119 us; skipping the padding rows alone: 99 us).
  float factor[C::MT][2];
#pragma unroll
  for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = mt * 16 + g + r * 8;
      float m_all = NEG_INF;
#pragma unroll
      for (int w = 0; w < C::NUM_WARPS; ++w) m_all = fmaxf(m_all, s_wmax[w * C::BM + row]);
      const float m_scaled = (m_all == NEG_INF) ? 0.f : m_all * at.scale_log2;
      factor[mt][r] = fast_exp2(st.row_max[mt][r] * at.scale_log2 - m_scaled);
      if (warp == 0 && t == 0) {
        float l_all = 0.f;
#pragma unroll
        for (int w = 0; w < C::NUM_WARPS; ++w)
          l_all += s_wsum[w * C::BM + row] * fast_exp2(s_wmax[w * C::BM + row] * at.scale_log2 - m_scaled);
        s_m[row] = m_all == NEG_INF ? NEG_INF : m_scaled;
        s_l[row] = l_all;
      }
    }
  auto add_rows = [&](bool first) {
#pragma unroll
    for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = mt * 16 + g + r * 8;
        if (at.m0 + row >= rows) continue;  // padding rows (e.g. 12 of 16 at Sq 1, group 4) are never read
        add_o_row<C>(s_acc + row * C::D, st.acc_o[mt], r, factor[mt][r], t, first);
      }
  };
  // Warp 0 stores, then the others add in turn: two copies of the code, not one a warp (the turns not unrolled).
  if (warp == 0) add_rows(true);
  __syncthreads();
#pragma unroll 1
  for (int w = 1; w < C::NUM_WARPS; ++w) {
    if (warp == w) add_rows(false);
    __syncthreads();
  }
  return CtaPartial<C>{s_acc, s_m, s_l};
}

// Rows first_row, first_row + row_step, ... of the block (row: 0 .. BM) finished from the NSPLITS partial
// results `part(s)` (a CtaPartial<C>-like view with m, l, acc readable by this CTA): merged, normalised,
// stored to O (and lse).
template <class C, int NSPLITS, class Parts>
__device__ __forceinline__ void finish_rows(const AttnArgs& a, int b, int hk, int m0, int rows, int first_row,
                                            int row_step, int heads, Parts part) {
  using T = typename C::T;
  constexpr int CHUNKS = C::D / 8;
  const int group = a.h_per_kv;
  const int my_rows = (C::BM - first_row + row_step - 1) / row_step;
  for (int i = threadIdx.x; i < my_rows * CHUNKS; i += C::THREADS) {
    const int row = first_row + (i / CHUNKS) * row_step, c = (i % CHUNKS) * 8;
    const int gr = m0 + row;
    if (row >= C::BM || gr >= rows) continue;
    float m_all = NEG_INF;
#pragma unroll
    for (int s = 0; s < NSPLITS; ++s) m_all = fmaxf(m_all, part(s).m[row]);
    const float m_ref = m_all == NEG_INF ? 0.f : m_all;
    float l_all = 0.f, o8[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int s = 0; s < NSPLITS; ++s) {
      const auto p = part(s);
      const float w = fast_exp2(p.m[row] - m_ref);  // 0 for a split that saw no key of the row
      l_all += p.l[row] * w;
      const float* acc = p.acc + row * C::D + c;
      const float4 lo = *reinterpret_cast<const float4*>(acc);
      const float4 hi = *reinterpret_cast<const float4*>(acc + 4);
      o8[0] += lo.x * w, o8[1] += lo.y * w, o8[2] += lo.z * w, o8[3] += lo.w * w;
      o8[4] += hi.x * w, o8[5] += hi.y * w, o8[6] += hi.z * w, o8[7] += hi.w * w;
    }
    // An FP8 cache's V scale (real V = stored x scale) multiplies O once, here.
    const float v_scale = C::KV_FP8 ? a.v_descale[(long long)b * row_position(heads, group) + hk] : 1.f;
    const float inv = l_all > 0.f ? v_scale / l_all : 0.f;
    const int p = row_position(gr, group), h = hk * group + row_head(gr, group);
    uint4 packed;
    packed.x = pack2<T>(o8[0] * inv, o8[1] * inv);
    packed.y = pack2<T>(o8[2] * inv, o8[3] * inv);
    packed.z = pack2<T>(o8[4] * inv, o8[5] * inv);
    packed.w = pack2<T>(o8[6] * inv, o8[7] * inv);
    *reinterpret_cast<uint4*>(static_cast<T*>(a.o) + b * a.o_sb + h * a.o_sh + p * a.o_ss + c) = packed;
    if (a.lse != nullptr && c == 0)
      a.lse[((long long)b * heads + h) * a.sq + p] = l_all > 0.f ? (m_all + log2f(l_all)) / LOG2E : NEG_INF;
  }
}

}  // namespace fc
