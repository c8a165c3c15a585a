// Decode and short-query attention (flash-decoding) for sm_90a.
//
// A CTA computes one block of BM rows for one (batch, K/V head): the rows are
// (query position, query head of the GQA group) pairs, so every K/V tile read
// serves the whole group. The keys are split across the SPLITS CTAs of a
// thread-block cluster; the warps of a CTA split each K/V tile again. Each
// warp keeps an online softmax over its keys (mma.sync m16n8k16 fed by
// ldmatrix; K/V tiles brought by TMA into a STAGES-deep ring, one mbarrier a
// stage, all STAGES in flight while a tile is used); the warps merge in
// shared memory, then the CTAs of the
// cluster merge through distributed shared memory, each finishing a share of
// the rows: no workspace, no second kernel, nothing to allocate per call.
//
// Problem: see common/attn_args.h. Grid: (row blocks * SPLITS, Hkv, B), row
// blocks = ceil(Sq * H / Hkv / BM). Causal masking is bottom-right aligned:
// query i sees key j iff j <= i + (Sk - Sq); rows that see no key give 0 and
// lse = -inf.

#include <cooperative_groups.h>

#include "attn_decode/config.h"
#include "attn_fwd_mma/ptx_sm80.h"
#include "attn_fwd_mma/tree_reduce.h"
#include "attn_fwd_wgmma/ptx_sm90.h"
#include "common/attn_args.h"
#include "common/utils.h"

namespace fc {

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
      const int p = gr / a.h_per_kv, h = hk * a.h_per_kv + gr % a.h_per_kv;
      val = *reinterpret_cast<const uint4*>(static_cast<const T*>(a.q) + b * a.q_sb + h * a.q_sh + p * a.q_ss + c);
    }
    *reinterpret_cast<uint4*>(sQ + C::QLayout::offset(r, c)) = val;
  }
}

// A paged K/V cache (vLLM's layout): K and V are [pages, page, Hkv, D]; sequence b's key n lives in page
// table[b * per_seq + n / page], row n % page. The tensor maps then cover the pages as [pages, Hkv, page, D]
// with boxes of min(BN, page) rows (page: a power of two >= 16, so a box never crosses a page and starts
// on the 128-byte swizzle's 1024-byte period). table == nullptr: the dense layout. The page size comes as
// its log2: shifts, not divisions, in the loop (the larger tiles have no register to spare).
struct Paging {
  const int* table;
  int page_shift, per_seq;
};

// Tile j (absolute) of K and V into ring slot `slot`, completing on the slot's mbarrier (one thread).
template <class C>
__device__ __forceinline__ void issue_kv(const TmaDesc& tk, const TmaDesc& tv, uint32_t sk, uint32_t sv,
                                         uint32_t bar, int j, int hk, int b, const Paging& pg) {
  mbar_expect_tx(bar, 2 * C::KV_TILE_BYTES);
  if (pg.table == nullptr) {
#pragma unroll
    for (int cb = 0; cb < C::D / 64; ++cb) {
      tma_load(sk + cb * C::KVLayout::BOX_BYTES, &tk, bar, cb * 64, j * C::BN, hk, b);
      tma_load(sv + cb * C::KVLayout::BOX_BYTES, &tv, bar, cb * 64, j * C::BN, hk, b);
    }
    return;
  }
  const int* table = pg.table + (long long)b * pg.per_seq;
  const int box = min(C::BN, 1 << pg.page_shift);
#pragma unroll 1
  for (int r = 0; r < C::BN; r += box) {
    const int n = j * C::BN + r;
    // A tile's rows past the table's capacity (masked keys) read its last page.
    const int page = table[min(n >> pg.page_shift, pg.per_seq - 1)];
    const int row = n & ((1 << pg.page_shift) - 1);
#pragma unroll
    for (int cb = 0; cb < C::D / 64; ++cb) {
      const uint32_t off = cb * C::KVLayout::BOX_BYTES + r * C::KVLayout::ROW_BYTES;
      tma_load(sk + off, &tk, bar, cb * 64, row, hk, page);  // a page id out of range reads zeros (TMA)
      tma_load(sv + off, &tv, bar, cb * 64, row, hk, page);
    }
  }
}

template <class C>
__device__ __forceinline__ void attn_decode(const TmaDesc& tk, const TmaDesc& tv, const AttnArgs& a,
                                            const int* seq_lens, const Paging pg) {
  // With seq_lens, batch row b uses its first seq_lens[b] keys (clamped to the tensor's Sk): a ragged
  // batch in one dense cache, or a static cache filled up to a length known only on the GPU.
  const int sk = seq_lens != nullptr ? min(max(seq_lens[blockIdx.z], 0), a.sk) : a.sk;
  using T = typename C::T;
  using QL = typename C::QLayout;
  using KL = typename C::KVLayout;
  using M = Mma<T>;
  namespace cg = cooperative_groups;

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  const uint32_t sK = smem_u32(smem_raw + C::Q_BYTES);
  const uint32_t sV = sK + C::STAGES * C::KV_TILE_BYTES;
  const uint32_t bars = sV + C::STAGES * C::KV_TILE_BYTES;  // STAGES mbarriers ("tile landed")

  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int split = (int)blockIdx.x % C::SPLITS;  // the CTA's rank in its cluster
  const int m0 = ((int)blockIdx.x / C::SPLITS) * C::BM;
  const int hk = blockIdx.y, b = blockIdx.z;
  const int group = a.h_per_kv;
  const int rows = group * a.sq;
  const int diag = sk - a.sq;  // bottom-right alignment offset

  // Keys the block's last query position sees, split in whole tiles across the cluster.
  int n_end = sk;
  if (C::CAUSAL) n_end = min(sk, max(0, (min(rows, m0 + C::BM) - 1) / group + diag + 1));
  const int tiles_all = (n_end + C::BN - 1) / C::BN;
  const int per_split = (tiles_all + C::SPLITS - 1) / C::SPLITS;
  const int j0 = split * per_split;
  const int n_tiles = max(0, min(tiles_all, j0 + per_split) - j0);
  const int p_first = m0 / group;  // the block's first query position: tiles past its diagonal need masks

  if (tid == 0) {
    tma_prefetch_map(&tk);
    tma_prefetch_map(&tv);
#pragma unroll
    for (int s = 0; s < C::STAGES; ++s) mbar_init(bars + 8 * s, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#pragma unroll
    for (int s = 0; s < C::STAGES; ++s)
      if (s < n_tiles)
        issue_kv<C>(tk, tv, sK + s * C::KV_TILE_BYTES, sV + s * C::KV_TILE_BYTES, bars + 8 * s, j0 + s, hk, b, pg);
  }
  load_packed_q<C>(sQ, a, b, hk, m0, rows);
  __syncthreads();  // Q stored, barriers initialised

  const int key_base = warp * C::KEYS_PER_WARP;
  const int q_row0 = (lane % 8) + ((lane / 8) % 2) * 8;
  const uint32_t q_rb = smem_u32(sQ) + q_row0 * QL::ROW_BYTES, q_cb = QL::chunk_bytes(q_row0, lane / 16);
  const int k_row0 = key_base + (lane / 16) * 8 + (lane % 8);
  const uint32_t k_rb = sK + k_row0 * KL::ROW_BYTES, k_cb = KL::chunk_bytes(k_row0, (lane / 8) % 2);
  const int v_row0 = key_base + ((lane / 8) % 2) * 8 + (lane % 8);
  const uint32_t v_rb = sV + v_row0 * KL::ROW_BYTES, v_cb = KL::chunk_bytes(v_row0, lane / 16);

  float acc_o[C::MT][C::DT][4];
  float row_max[C::MT][2], row_sum[C::MT][2];
#pragma unroll
  for (int mt = 0; mt < C::MT; ++mt) {
#pragma unroll
    for (int dt = 0; dt < C::DT; ++dt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc_o[mt][dt][i] = 0.f;
    row_max[mt][0] = row_max[mt][1] = NEG_INF;
    row_sum[mt][0] = row_sum[mt][1] = 0.f;
  }
  const float scale_log2 = a.scale * LOG2E;

  for (int j = 0; j < n_tiles; ++j) {
    const int slot = j % C::STAGES;
    mbar_wait(bars + 8 * slot, (j / C::STAGES) & 1);  // K_j and V_j have landed
    const uint32_t slot_bytes = (uint32_t)slot * C::KV_TILE_BYTES;
    const uint32_t tk_rb = k_rb + slot_bytes, tv_rb = v_rb + slot_bytes;

    // ---- S = Q K^T: every row of the block x this warp's keys of the tile
    float acc_s[C::MT][C::NT][4];
#pragma unroll
    for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < C::NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc_s[mt][nt][i] = 0.f;
#pragma unroll
    for (int kd = 0; kd < C::KD; ++kd) {
      uint32_t a_frag[C::MT][4];
#pragma unroll
      for (int mt = 0; mt < C::MT; ++mt) ldmatrix_x4(a_frag[mt], QL::addr(q_rb, q_cb, mt * 16, kd * 16));
#pragma unroll
      for (int np = 0; np < C::NT / 2; ++np) {
        uint32_t b_frag[4];
        ldmatrix_x4(b_frag, KL::addr(tk_rb, k_cb, np * 16, kd * 16));
#pragma unroll
        for (int mt = 0; mt < C::MT; ++mt) {
          M::run(acc_s[mt][2 * np], a_frag[mt], b_frag[0], b_frag[1]);
          M::run(acc_s[mt][2 * np + 1], a_frag[mt], b_frag[2], b_frag[3]);
        }
      }
    }

    // ---- masks: keys past the end, and past each row's causal limit
    const int n0 = (j0 + j) * C::BN;
    if (n0 + C::BN > n_end || (C::CAUSAL && n0 + C::BN - 1 > p_first + diag)) {
#pragma unroll
      for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int p = (m0 + mt * 16 + g + r * 8) / group;
          const int limit = C::CAUSAL ? min(n_end, p + diag + 1) : n_end;
#pragma unroll
          for (int nt = 0; nt < C::NT; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              if (n0 + key_base + nt * 8 + 2 * t + e >= limit) acc_s[mt][nt][2 * r + e] = NEG_INF;
        }
    }

    // ---- online softmax (row max shared by the thread quad; sums reduced at the end)
#pragma unroll
    for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float vals[2 * C::NT];
#pragma unroll
        for (int nt = 0; nt < C::NT; ++nt) {
          vals[2 * nt] = acc_s[mt][nt][2 * r];
          vals[2 * nt + 1] = acc_s[mt][nt][2 * r + 1];
        }
        TreeReduce<C::NT>::run(vals, MaxOp());
        float mx = fmaxf(row_max[mt][r], vals[0]);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
        const float m_scaled = (mx == NEG_INF) ? 0.f : mx * scale_log2;
        const float alpha = fast_exp2(row_max[mt][r] * scale_log2 - m_scaled);
        row_max[mt][r] = mx;
#pragma unroll
        for (int nt = 0; nt < C::NT; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float p = fast_exp2(fmaf(acc_s[mt][nt][2 * r + e], scale_log2, -m_scaled));
            acc_s[mt][nt][2 * r + e] = p;
            vals[2 * nt + e] = p;
          }
        TreeReduce<C::NT>::run(vals, AddOp());
        row_sum[mt][r] = row_sum[mt][r] * alpha + vals[0];
#pragma unroll
        for (int dt = 0; dt < C::DT; ++dt) {
          acc_o[mt][dt][2 * r] *= alpha;
          acc_o[mt][dt][2 * r + 1] *= alpha;
        }
      }

    // ---- O += P V
#pragma unroll
    for (int kk = 0; kk < C::KN; ++kk) {
      uint32_t p_frag[C::MT][4];
#pragma unroll
      for (int mt = 0; mt < C::MT; ++mt) {
        p_frag[mt][0] = pack2<T>(acc_s[mt][2 * kk][0], acc_s[mt][2 * kk][1]);
        p_frag[mt][1] = pack2<T>(acc_s[mt][2 * kk][2], acc_s[mt][2 * kk][3]);
        p_frag[mt][2] = pack2<T>(acc_s[mt][2 * kk + 1][0], acc_s[mt][2 * kk + 1][1]);
        p_frag[mt][3] = pack2<T>(acc_s[mt][2 * kk + 1][2], acc_s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < C::DT / 2; ++dp) {
        uint32_t b_frag[4];
        ldmatrix_x4_trans(b_frag, KL::addr(tv_rb, v_cb, kk * 16, dp * 16));
#pragma unroll
        for (int mt = 0; mt < C::MT; ++mt) {
          M::run(acc_o[mt][2 * dp], p_frag[mt], b_frag[0], b_frag[1]);
          M::run(acc_o[mt][2 * dp + 1], p_frag[mt], b_frag[2], b_frag[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with the slot: refill it with tile j + STAGES
    if (tid == 0 && j + C::STAGES < n_tiles)
      issue_kv<C>(tk, tv, sK + slot_bytes, sV + slot_bytes, bars + 8 * slot, j0 + j + C::STAGES, hk, b, pg);
  }

  // ---- merge the warps: O (unnormalised, relative to the CTA's row max) and the row stats in shared memory
#pragma unroll
  for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_sum[mt][r] += __shfl_xor_sync(0xffffffff, row_sum[mt][r], 1);
      row_sum[mt][r] += __shfl_xor_sync(0xffffffff, row_sum[mt][r], 2);
    }
  __syncthreads();  // every warp is done with the K/V ring (all its loads waited for), which the merge reuses
  float* s_acc = reinterpret_cast<float*>(smem_raw + C::Q_BYTES);  // [BM][D]
  float* s_wmax = s_acc + C::BM * C::D;                                        // [NUM_WARPS][BM]
  float* s_wsum = s_wmax + C::NUM_WARPS * C::BM;                               // [NUM_WARPS][BM]
  float* s_m = s_wsum + C::NUM_WARPS * C::BM;  // [BM] the CTA's row max, log2 units (-inf: no key)
  float* s_l = s_m + C::BM;                    // [BM] the CTA's row sum relative to s_m
#pragma unroll
  for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      if (t == 0) {
        const int row = mt * 16 + g + r * 8;
        s_wmax[warp * C::BM + row] = row_max[mt][r];
        s_wsum[warp * C::BM + row] = row_sum[mt][r];
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
      const float m_scaled = (m_all == NEG_INF) ? 0.f : m_all * scale_log2;
      factor[mt][r] = fast_exp2(row_max[mt][r] * scale_log2 - m_scaled);
      if (warp == 0 && t == 0) {
        float l_all = 0.f;
#pragma unroll
        for (int w = 0; w < C::NUM_WARPS; ++w)
          l_all += s_wsum[w * C::BM + row] * fast_exp2(s_wmax[w * C::BM + row] * scale_log2 - m_scaled);
        s_m[row] = m_all == NEG_INF ? NEG_INF : m_scaled;
        s_l[row] = l_all;
      }
    }
#pragma unroll
  for (int w = 0; w < C::NUM_WARPS; ++w) {
    if (warp == w) {
#pragma unroll
      for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = mt * 16 + g + r * 8;
          if (m0 + row >= rows) continue;  // padding rows (e.g. 12 of 16 at Sq 1, group 4) are never read
#pragma unroll
          for (int dt = 0; dt < C::DT; ++dt) {
            float2* dst = reinterpret_cast<float2*>(s_acc + row * C::D + dt * 8 + 2 * t);
            const float2 mine = make_float2(acc_o[mt][dt][2 * r] * factor[mt][r], acc_o[mt][dt][2 * r + 1] * factor[mt][r]);
            if (w == 0) {
              *dst = mine;
            } else {
              const float2 sum = *dst;
              *dst = make_float2(sum.x + mine.x, sum.y + mine.y);
            }
          }
        }
    }
    __syncthreads();
  }

  // ---- merge the CTAs of the cluster: rank s finishes rows s, s + SPLITS, ...
  cg::cluster_group cluster = cg::this_cluster();
  if constexpr (C::SPLITS > 1) cluster.sync();  // every CTA's merge is in its shared memory
  else __syncthreads();
  // The other CTAs' shared memory, mapped per use (a register array of SPLITS pointers would not fit).
  auto remote = [&](float* local, int s) -> const float* {
    if constexpr (C::SPLITS > 1) return cluster.map_shared_rank(local, s);
    else return local;
  };
  constexpr int CHUNKS = C::D / 8;
  constexpr int MY_ROWS = (C::BM + C::SPLITS - 1) / C::SPLITS;
  const int heads = (int)gridDim.y * group;
  for (int i = tid; i < MY_ROWS * CHUNKS; i += C::THREADS) {
    const int row = split + (i / CHUNKS) * C::SPLITS, c = (i % CHUNKS) * 8;
    const int gr = m0 + row;
    if (row >= C::BM || gr >= rows) continue;
    float m_all = NEG_INF;
#pragma unroll
    for (int s = 0; s < C::SPLITS; ++s) m_all = fmaxf(m_all, remote(s_m, s)[row]);
    const float m_ref = m_all == NEG_INF ? 0.f : m_all;
    float l_all = 0.f, o8[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int s = 0; s < C::SPLITS; ++s) {
      const float w = fast_exp2(remote(s_m, s)[row] - m_ref);  // 0 for a CTA that saw no key of the row
      l_all += remote(s_l, s)[row] * w;
      const float* acc = remote(s_acc, s) + row * C::D + c;
      const float4 lo = *reinterpret_cast<const float4*>(acc);
      const float4 hi = *reinterpret_cast<const float4*>(acc + 4);
      o8[0] += lo.x * w, o8[1] += lo.y * w, o8[2] += lo.z * w, o8[3] += lo.w * w;
      o8[4] += hi.x * w, o8[5] += hi.y * w, o8[6] += hi.z * w, o8[7] += hi.w * w;
    }
    const float inv = l_all > 0.f ? 1.f / l_all : 0.f;
    const int p = gr / group, h = hk * group + gr % group;
    uint4 packed;
    packed.x = pack2<T>(o8[0] * inv, o8[1] * inv);
    packed.y = pack2<T>(o8[2] * inv, o8[3] * inv);
    packed.z = pack2<T>(o8[4] * inv, o8[5] * inv);
    packed.w = pack2<T>(o8[6] * inv, o8[7] * inv);
    *reinterpret_cast<uint4*>(static_cast<T*>(a.o) + b * a.o_sb + h * a.o_sh + p * a.o_ss + c) = packed;
    if (a.lse != nullptr && c == 0)
      a.lse[((long long)b * heads + h) * a.sq + p] = l_all > 0.f ? (m_all + log2f(l_all)) / LOG2E : NEG_INF;
  }
  if constexpr (C::SPLITS > 1) cluster.sync();  // no CTA leaves while another still reads its shared memory
}

}  // namespace fc

// The tuner appends, for one variant (tuner/kernels/render.py):
//   using TunerCfg = fc::DecodeConfig<...>;
//   extern "C" __global__ void __launch_bounds__(TunerCfg::THREADS, TunerCfg::MIN_BLOCKS)
//   __cluster_dims__(TunerCfg::SPLITS, 1, 1) <name>(ATTN_FWD_PARAMS) { ATTN_FWD_BODY(TunerCfg) }
// The parameters are the Hopper template's: the tensor maps of q, k, v first (q's is not read: the packed
// rows come from several heads), then the tensor arguments, heads and batch; then the per-batch key
// lengths (null: every row uses all Sk keys) and the paging (block_table null: dense K/V; else Sk is the
// table's capacity, pages_per_seq << page_shift).
#define ATTN_FWD_PARAMS                                                                                        \
  const __grid_constant__ fc::TmaDesc tmap_q, const __grid_constant__ fc::TmaDesc tmap_k,                      \
      const __grid_constant__ fc::TmaDesc tmap_v, ATTN_FWD_TENSOR_PARAMS, int heads, int batch,                \
      const int* seq_lens, const int* block_table, int page_shift, int pages_per_seq

#define ATTN_FWD_BODY(CFG)                                                                                     \
  fc::attn_decode<CFG>(tmap_k, tmap_v, ATTN_FWD_ARGS(heads, batch), seq_lens,                                  \
                       fc::Paging{block_table, page_shift, pages_per_seq});
