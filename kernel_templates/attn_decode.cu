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

#include "attn_decode/tile.h"
#include "common/ptx_sm90.h"

namespace fc {

// Page-table entries are read PAGE_PREFETCH at a time before their copies are issued: one memory latency per
// PAGE_PREFETCH pages, not one a page (the issuing thread also computes: with 16-row pages, four dependent reads a
// tile stalled its warp, and the CTA behind it, for ~20% of an FP8 cache's time). A few registers, not BN / 16:
// every decode kernel holds them, dense ones too.
constexpr int PAGE_PREFETCH = 4;
struct PageIds {
  int id[PAGE_PREFETCH];
};

// The pages holding tile j's (absolute) rows r0, r0 + box, ... (those below BN; box = min(BN, page)). A tile's
// rows past the table's capacity (masked keys) read its last page.
template <class C>
__device__ __forceinline__ PageIds page_ids(const Paging& pg, int b, int j, int r0) {
  const int* table = pg.table + (long long)b * pg.per_seq;
  const int box = min(C::BN, 1 << pg.page_shift);
  PageIds out;
#pragma unroll
  for (int i = 0; i < PAGE_PREFETCH; ++i)
    if (r0 + i * box < C::BN) out.id[i] = table[min((j * C::BN + r0 + i * box) >> pg.page_shift, pg.per_seq - 1)];
  return out;
}

// Tile j (absolute) of K and V into ring slot `slot`, completing on the slot's mbarrier (one thread). A paged
// cache: `first` holds page_ids(pg, b, j, 0), read by the caller ahead of time.
template <class C>
__device__ __forceinline__ void issue_kv(const TmaDesc& tk, const TmaDesc& tv, uint32_t sk, uint32_t sv,
                                         uint32_t bar, int j, int hk, int b, const Paging& pg, const PageIds& first) {
  mbar_expect_tx(bar, 2 * C::KV_TILE_BYTES);
  if (pg.table == nullptr) {
#pragma unroll
    for (int cb = 0; cb < C::D / C::KVLayout::COLS; ++cb) {
      tma_load(sk + cb * C::KVLayout::BOX_BYTES, &tk, bar, cb * C::KVLayout::COLS, j * C::BN, hk, b);
      tma_load(sv + cb * C::KVLayout::BOX_BYTES, &tv, bar, cb * C::KVLayout::COLS, j * C::BN, hk, b);
    }
    return;
  }
  const int box = min(C::BN, 1 << pg.page_shift);
#pragma unroll 1
  for (int r0 = 0; r0 < C::BN; r0 += PAGE_PREFETCH * box) {
    const PageIds page = r0 == 0 ? first : page_ids<C>(pg, b, j, r0);
#pragma unroll
    for (int i = 0; i < PAGE_PREFETCH; ++i) {
      const int r = r0 + i * box;
      if (r >= C::BN) break;
      const int row = (j * C::BN + r) & ((1 << pg.page_shift) - 1);
#pragma unroll
      for (int cb = 0; cb < C::D / C::KVLayout::COLS; ++cb) {
        const uint32_t off = cb * C::KVLayout::BOX_BYTES + r * C::KVLayout::ROW_BYTES;
        tma_load(sk + off, &tk, bar, cb * C::KVLayout::COLS, row, hk, page.id[i]);  // a page id out of range: zeros
        tma_load(sv + off, &tv, bar, cb * C::KVLayout::COLS, row, hk, page.id[i]);
      }
    }
  }
}

// V rows from `first` to the tile's end set to zero. TMA fills rows past the tensor (or a table's -1 entries)
// with zeros, but rows past a batch row's own length come from the cache: masked (P = 0), yet a NaN or Inf there
// would poison O through 0 * NaN in P V. Each thread owns one 16-byte chunk column (which box, which chunk: a
// split by compile-time powers of two) and walks down the rows, so no division by the runtime row count; the
// 128-byte swizzle only permutes chunks within a row, and every chunk of a row is zeroed. Then the fence: the
// slot is refilled by TMA (the async proxy) after these generic-proxy writes.
template <class C>
__device__ __forceinline__ void zero_v_rows(unsigned char* tile, int first) {
  using KL = typename C::KVLayout;
  constexpr int CHUNKS = KL::ROW_BYTES / 16;                  // a row's 16-byte chunks within one 128-byte box
  constexpr int ROW_CHUNKS = CHUNKS * (C::D / KL::COLS);      // a key row's chunks over all its boxes
  static_assert(C::THREADS % ROW_CHUNKS == 0, "the threads cover whole rows in each pass");
  constexpr int ROWS_PER_PASS = C::THREADS / ROW_CHUNKS;
  const unsigned tid = threadIdx.x;
  unsigned char* col = tile + (tid / CHUNKS) % (C::D / KL::COLS) * KL::BOX_BYTES + tid % CHUNKS * 16;
  // first >= 1: a tile is only loaded when it holds one of the row's keys. Once a call (the row's last tile):
  // not unrolled, a few instructions in the loop's code rather than ~70.
#pragma unroll 1
  for (int r = first + (int)(tid / ROW_CHUNKS); r < C::BN; r += ROWS_PER_PASS)
    *reinterpret_cast<uint4*>(col + r * KL::ROW_BYTES) = make_uint4(0u, 0u, 0u, 0u);
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
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

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  auto* sQ = reinterpret_cast<typename C::Compute*>(smem_raw);
  const uint32_t sK = smem_u32(smem_raw + C::Q_BYTES);
  const uint32_t sV = sK + C::STAGES * C::KV_TILE_BYTES;
  const uint32_t bars = sV + C::STAGES * C::KV_TILE_BYTES;  // STAGES mbarriers ("tile landed")

  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int split = (int)(blockIdx.x % C::SPLITS);  // the CTA's rank in its cluster (unsigned: masks, shifts)
  const int m0 = (int)(blockIdx.x / C::SPLITS) * C::BM;
  const int hk = blockIdx.y, b = blockIdx.z;
  const int group = a.h_per_kv;
  const int rows = group * a.sq;
  const int diag = sk - a.sq;  // bottom-right alignment offset

  const CtaKeys keys = key_range<C>(sk, a.sq, group, m0, split);
  const int n_end = keys.n_end, j0 = keys.j0, n_tiles = keys.n_tiles;

  if (tid == 0) {
    tma_prefetch_map(&tk);
    tma_prefetch_map(&tv);
#pragma unroll
    for (int s = 0; s < C::STAGES; ++s) mbar_init(bars + 8 * s, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    // Not unrolled: each issue_kv holds the paged path (~300 instructions), and this runs once a call.
#pragma unroll 1
    for (int s = 0; s < min(C::STAGES, n_tiles); ++s) {
      PageIds first;
      if (pg.table != nullptr) first = page_ids<C>(pg, b, j0 + s, 0);
      issue_kv<C>(tk, tv, sK + s * C::KV_TILE_BYTES, sV + s * C::KV_TILE_BYTES, bars + 8 * s, j0 + s, hk, b, pg,
                  first);
    }
  }
  // An FP8 cache: Q goes in as fp16 times 2^e (kv_fp8.h), and K's scale and 2^-e join the softmax scale.
  float scale = a.scale;
  if constexpr (C::KV_FP8) {
    const int kv_head = b * (int)gridDim.y + hk;
    scale *= a.k_descale[kv_head] * load_packed_q_fp16<C>(sQ, a, b, hk, m0, rows,
                                                          reinterpret_cast<float*>(smem_raw + C::QMAX_OFFSET));
  } else {
    load_packed_q<C>(sQ, a, b, hk, m0, rows);
  }
  __syncthreads();  // Q stored, barriers initialised

  const int key_base = warp * C::KEYS_PER_WARP;
  const int q_row0 = (lane % 8) + ((lane / 8) % 2) * 8;
  const uint32_t q_rb = smem_u32(sQ) + q_row0 * QL::ROW_BYTES, q_cb = QL::chunk_bytes(q_row0, lane / 16);
  const int k_row0 = key_base + (lane / 16) * 8 + (lane % 8);
  const uint32_t k_rb = sK + k_row0 * KL::ROW_BYTES, k_cb = KL::chunk_bytes(k_row0, (lane / 8) % 2);
  const int v_row0 = C::KV_FP8 ? key_base + 2 * t : key_base + ((lane / 8) % 2) * 8 + (lane % 8);
  const uint32_t v_rb = sV + v_row0 * KL::ROW_BYTES;
  const uint32_t v_cb = C::KV_FP8 ? KL::chunk_bytes(v_row0, g / 4) | (4 * (g % 4))  // warp_pv_kv8's 32-bit loads
                                  : KL::chunk_bytes(v_row0, lane / 16);

  WarpState<C> st;
  st.init();
  const TilePlace at = tile_place<C>(m0, group, rows, diag, n_end, key_base, g, t, scale);

  // Tile j's ring slot (j % STAGES) and its barrier's phase ((j / STAGES) & 1), advanced with j: no division
  // at three stages, no shifts and masks at two or four.
  uint32_t slot = 0, phase = 0;
  for (int j = 0; j < n_tiles; ++j) {
    mbar_wait(bars + 8 * slot, phase);  // K_j and V_j have landed
    const uint32_t slot_bytes = slot * C::KV_TILE_BYTES;
    if ((j0 + j + 1) * C::BN > sk) {  // the tile with the row's last key: zero V past it (see zero_v_rows)
      zero_v_rows<C>(smem_raw + C::Q_BYTES + C::STAGES * C::KV_TILE_BYTES + slot_bytes, sk - (j0 + j) * C::BN);
      __syncthreads();
    }
    // The refill's first page-table entries are read before this tile's math, which hides their latency: read
    // after it, they delayed every refill by a memory round trip, with the whole CTA waiting at the next barrier.
    const bool refill = tid == 0 && j + C::STAGES < n_tiles;
    PageIds next;
    if (refill && pg.table != nullptr) next = page_ids<C>(pg, b, j0 + j + C::STAGES, 0);
    decode_tile<C>(st, at, q_rb, q_cb, k_rb + slot_bytes, k_cb, v_rb + slot_bytes, v_cb, (j0 + j) * C::BN);
    __syncthreads();  // every warp is done with the slot: refill it with tile j + STAGES
    if (refill)
      issue_kv<C>(tk, tv, sK + slot_bytes, sV + slot_bytes, bars + 8 * slot, j0 + j + C::STAGES, hk, b, pg, next);
    if (++slot == C::STAGES) slot = 0, phase ^= 1;
  }

  __syncthreads();  // every warp is done with the K/V ring (all its loads waited for), which the merge reuses
  const CtaPartial<C> mine = merge_warps<C>(st, smem_raw, at, warp, rows);

  // ---- merge the CTAs of the cluster: rank s finishes rows s, s + SPLITS, ... reading the others' partial
  // results in place (distributed shared memory: no workspace, no second kernel)
  // The cluster builtins cooperative_groups' cluster_group wraps (its sync() and map_shared_rank()), called
  // directly: <cooperative_groups.h> alone doubled the compile's CPU time.
  if constexpr (C::SPLITS > 1) cluster_sync();  // every CTA's merge is in its shared memory
  else __syncthreads();
  // The other CTAs' shared memory, mapped per use (a register array of SPLITS pointers would not fit).
  auto remote = [&](int s) -> CtaPartial<C> {
    if constexpr (C::SPLITS > 1)
      return CtaPartial<C>{map_shared_rank(mine.acc, s), map_shared_rank(mine.m, s), map_shared_rank(mine.l, s)};
    else return mine;
  };
  finish_rows<C, C::SPLITS>(a, b, hk, m0, rows, split, C::SPLITS, (int)gridDim.y * group, remote);
  if constexpr (C::SPLITS > 1) cluster_sync();  // no CTA leaves while another still reads its shared memory
}

}  // namespace fc

// The tuner appends, for one variant (tuner/kernels/render.py):
//   using TunerCfg = fc::DecodeConfig<...>;
//   extern "C" __global__ void __launch_bounds__(TunerCfg::THREADS, TunerCfg::MIN_BLOCKS)
//   __cluster_dims__(TunerCfg::SPLITS, 1, 1) <name>(ATTN_FWD_PARAMS) { ATTN_FWD_BODY(TunerCfg) }
// The parameters are the Hopper template's: the tensor maps of q, k, v first (q's is not read: the packed
// rows come from several heads), then the tensor arguments, heads, batch and the three descale pointers
// (q's unused; k's and v's an FP8 cache's scales, float32 [B, Hkv], null for 16-bit K/V); then the
// per-batch key lengths (null: every row uses all Sk keys) and the paging (block_table null: dense K/V;
// else Sk is the table's capacity, pages_per_seq << page_shift).
#define ATTN_FWD_PARAMS                                                                                        \
  const __grid_constant__ fc::TmaDesc tmap_q, const __grid_constant__ fc::TmaDesc tmap_k,                      \
      const __grid_constant__ fc::TmaDesc tmap_v, ATTN_FWD_TENSOR_PARAMS, int heads, int batch,                \
      const float* q_descale, const float* k_descale, const float* v_descale, const int* seq_lens,            \
      const int* block_table, int page_shift, int pages_per_seq

#define ATTN_FWD_BODY(CFG)                                                                                     \
  fc::AttnArgs args_ = ATTN_FWD_ARGS(heads, batch);                                                            \
  args_.k_descale = k_descale;                                                                                 \
  args_.v_descale = v_descale;                                                                                 \
  fc::attn_decode<CFG>(tmap_k, tmap_v, args_, seq_lens, fc::Paging{block_table, page_shift, pages_per_seq});
