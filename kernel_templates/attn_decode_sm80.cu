// Decode and short-query attention (flash-decoding) for sm_80 and newer.
//
// The sm_90 template's design (attn_decode.cu) without Hopper's TMA and
// clusters: a CTA computes one block of BM packed (query position, query
// head of the GQA group) rows for one (batch, K/V head) over its share of the
// keys; K/V tiles come by cp.async (16-byte chunks written in the same
// 128-byte-swizzled layout TMA would write) into a ring of STAGES tiles; the
// warps split each tile and merge in shared memory (attn_decode/tile.h).
// The SPLITS CTAs of a row block then merge through a workspace in global
// memory: each writes its partial O and row statistics, and the last to
// arrive (an atomic counter per row block, reset by that CTA) reads them all
// from L2 and writes O and lse. SPLITS == 1 merges in place.
//
// Problem: see common/attn_args.h. Grid: (row blocks * SPLITS, Hkv, B), row
// blocks = ceil(Sq * H / Hkv / BM). Causal masking is bottom-right aligned.

#include "attn_decode/tile.h"

namespace fc {

// Tile j (absolute) of K and V into ring slot (sk, sv) by cp.async, every thread a share of the 16-byte
// chunks, each at the chunk TMA's 128-byte swizzle would use (KVLayout), so the tile math is the same.
// Rows past the batch row's length `len` are zero-filled, not read: they are masked (P = 0), but a NaN or Inf
// left in a cache's unused rows would still poison O through 0 * NaN in P V.
template <class C>
__device__ __forceinline__ void load_kv_async(typename C::T* sk, typename C::T* sv, const AttnArgs& a, int j,
                                              int hk, int b, const Paging& pg, int len) {
  using T = typename C::T;
  constexpr int CHUNKS = C::D / 8;  // 16-byte chunks a row
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);
  for (int i = threadIdx.x; i < C::BN * CHUNKS; i += C::THREADS) {
    const int r = i / CHUNKS, c = i % CHUNKS;
    const int n = j * C::BN + r;
    const bool valid = n < len;  // len <= a.sk, the tensor's keys (paged: the table's capacity)
    long long ko, vo;  // element offsets of row n in K and V (their strides may differ)
    if (pg.table == nullptr) {
      const long long row = min(n, a.sk - 1);
      ko = b * a.k_sb + hk * a.k_sh + row * a.k_ss;
      vo = b * a.v_sb + hk * a.v_sh + row * a.v_ss;
    } else {  // K/V as [pages, Hkv, page, D] views: the batch stride is the page's; unused entries (-1): page 0
      const int page = max(pg.table[(long long)b * pg.per_seq + min(n >> pg.page_shift, pg.per_seq - 1)], 0);
      const long long row = n & ((1 << pg.page_shift) - 1);
      ko = page * a.k_sb + hk * a.k_sh + row * a.k_ss;
      vo = page * a.v_sb + hk * a.v_sh + row * a.v_ss;
    }
    const uint32_t dst = (c / 8) * C::KVLayout::BOX_BYTES + r * C::KVLayout::ROW_BYTES + (((c % 8) ^ (r & 7)) << 4);
    cp_async_16(reinterpret_cast<unsigned char*>(sk) + dst, k + ko + c * 8, valid);
    cp_async_16(reinterpret_cast<unsigned char*>(sv) + dst, v + vo + c * 8, valid);
  }
}

template <class C>
__device__ __forceinline__ void attn_decode_sm80(const AttnArgs& a, const int* seq_lens, const Paging pg,
                                                 float* workspace, int* counters) {
  const int sk = seq_lens != nullptr ? min(max(seq_lens[blockIdx.z], 0), a.sk) : a.sk;
  using T = typename C::T;
  using QL = typename C::QLayout;
  using KL = typename C::KVLayout;

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = reinterpret_cast<T*>(smem_raw + C::Q_BYTES);
  T* sV = reinterpret_cast<T*>(smem_raw + C::Q_BYTES + C::STAGES * C::KV_TILE_BYTES);

  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int split = (int)blockIdx.x % C::SPLITS;
  const int block = (int)blockIdx.x / C::SPLITS;
  const int m0 = block * C::BM;
  const int hk = blockIdx.y, b = blockIdx.z;
  const int group = a.h_per_kv;
  const int rows = group * a.sq;
  const int diag = sk - a.sq;

  const CtaKeys keys = key_range<C>(sk, a.sq, group, m0, split);
  const int n_end = keys.n_end, j0 = keys.j0, n_tiles = keys.n_tiles;

  // STAGES - 1 tiles in flight before the loop; one commit group a tile (empty groups keep the count).
#pragma unroll
  for (int s = 0; s < C::STAGES - 1; ++s) {
    if (s < n_tiles)
      load_kv_async<C>(sK + s * C::KV_TILE_BYTES / (int)sizeof(T), sV + s * C::KV_TILE_BYTES / (int)sizeof(T), a,
                       j0 + s, hk, b, pg, sk);
    cp_async_commit();
  }
  load_packed_q<C>(sQ, a, b, hk, m0, rows);

  const int key_base = warp * C::KEYS_PER_WARP;
  const int q_row0 = (lane % 8) + ((lane / 8) % 2) * 8;
  const uint32_t q_rb = smem_u32(sQ) + q_row0 * QL::ROW_BYTES, q_cb = QL::chunk_bytes(q_row0, lane / 16);
  const int k_row0 = key_base + (lane / 16) * 8 + (lane % 8);
  const uint32_t k_rb = smem_u32(sK) + k_row0 * KL::ROW_BYTES, k_cb = KL::chunk_bytes(k_row0, (lane / 8) % 2);
  const int v_row0 = key_base + ((lane / 8) % 2) * 8 + (lane % 8);
  const uint32_t v_rb = smem_u32(sV) + v_row0 * KL::ROW_BYTES, v_cb = KL::chunk_bytes(v_row0, lane / 16);

  WarpState<C> st;
  st.init();
  const TilePlace at = tile_place<C>(m0, group, rows, diag, n_end, key_base, g, t, a.scale);

  for (int j = 0; j < n_tiles; ++j) {
    cp_async_wait<C::STAGES - 2>();  // tile j has landed (this thread's copies) ...
    __syncthreads();                 // ... everyone's, and every warp is done with tile j - 1's slot
    const int next = j + C::STAGES - 1;
    if (next < n_tiles) {
      const int ns = next % C::STAGES;
      load_kv_async<C>(sK + ns * C::KV_TILE_BYTES / (int)sizeof(T), sV + ns * C::KV_TILE_BYTES / (int)sizeof(T), a,
                       j0 + next, hk, b, pg, sk);
    }
    cp_async_commit();
    const uint32_t slot_bytes = (uint32_t)(j % C::STAGES) * C::KV_TILE_BYTES;
    decode_tile<C>(st, at, q_rb, q_cb, k_rb + slot_bytes, k_cb, v_rb + slot_bytes, v_cb, (j0 + j) * C::BN);
  }
  cp_async_wait<0>();
  __syncthreads();  // Q stored (no tile: the loop's barrier never ran), the ring free for the merge
  const CtaPartial<C> mine = merge_warps<C>(st, smem_raw, at, warp, rows);
  const int heads = (int)gridDim.y * group;

  if constexpr (C::SPLITS == 1) {
    finish_rows<C, 1>(a, b, hk, m0, rows, 0, 1, heads, [&](int) { return mine; });
  } else {
    // Workspace: per row block (blocks, Hkv, B) SPLITS partial results of BM x (D + 2) floats.
    const long long cluster = block + (long long)(gridDim.x / C::SPLITS) * (hk + (long long)gridDim.y * b);
    constexpr int PART = C::BM * (C::D + 2);
    float* base = workspace + cluster * C::SPLITS * PART;
    float* own = base + split * PART;
    for (int i = tid; i < C::BM * C::D / 4; i += C::THREADS)
      reinterpret_cast<float4*>(own)[i] = reinterpret_cast<const float4*>(mine.acc)[i];
    for (int i = tid; i < C::BM; i += C::THREADS) {
      own[C::BM * C::D + i] = mine.m[i];
      own[C::BM * C::D + C::BM + i] = mine.l[i];
    }
    __threadfence();  // the partial result is visible device-wide before the count says so
    __syncthreads();
    __shared__ int last;
    if (tid == 0) last = atomicAdd(counters + cluster, 1) == C::SPLITS - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();  // the other splits' partial results, published before their increments, are read after
    auto part = [&](int s) {
      const float* p = base + s * PART;
      return CtaPartial<C>{const_cast<float*>(p), const_cast<float*>(p + C::BM * C::D),
                           const_cast<float*>(p + C::BM * C::D + C::BM)};
    };
    finish_rows<C, C::SPLITS>(a, b, hk, m0, rows, 0, 1, heads, part);
    if (tid == 0) counters[cluster] = 0;  // ready for the next launch (a captured graph replays it as is)
  }
}

}  // namespace fc

// The tuner appends, for one variant (tuner/kernels/render.py):
//   using TunerCfg = fc::DecodeConfig<...>;
//   extern "C" __global__ void __launch_bounds__(TunerCfg::THREADS, TunerCfg::MIN_BLOCKS) <name>(ATTN_FWD_PARAMS)
//   { ATTN_FWD_BODY(TunerCfg) }
// The parameters: the tensor arguments; the per-batch key lengths (null: every row uses all Sk keys) and
// the paging (block_table null: dense K/V; else Sk is the table's capacity); then the split merge's
// workspace (floats) and counters (ints, zero between launches; unused with SPLITS 1). Heads and batch
// come from the grid (Hkv x group, B).
#define ATTN_FWD_PARAMS                                                                                        \
  ATTN_FWD_TENSOR_PARAMS, const int *seq_lens, const int *block_table, int page_shift, int pages_per_seq,     \
      float *workspace, int *counters

#define ATTN_FWD_BODY(CFG)                                                                                     \
  fc::attn_decode_sm80<CFG>(ATTN_FWD_ARGS((int)gridDim.y * h_per_kv, (int)gridDim.z), seq_lens,                \
                            fc::Paging{block_table, page_shift, pages_per_seq}, workspace, counters);
