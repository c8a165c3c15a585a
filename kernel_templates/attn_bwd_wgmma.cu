// FlashAttention-3-style attention backward pass for Hopper (sm_90a): wgmma on 128-byte swizzled shared tiles, the
// query tiles loaded by every thread (cp.async, one CTA barrier a tile) or by a producer warpgroup (PRODUCER: TMA
// and bulk copies into an mbarrier ring); dQ reduced by the consumers (vector or, DQ_BULK, bulk reductions) or by
// writer warps of the producer (DQ_WRITER; with DQ_BULK a 64 x 64-blocked accumulator, one bulk reduction a block).
//
// Three kernels, the sm_80 template's parameter list and row kernels (attn_bwd_mma/args.h, rows.h), launched in
// order by tuner/runtime/backward_launch.py:
//   <name>_dot_do_o   delta = rowsum(dO * O) (fp32), lse in log2 units, dQ's fp32 accumulator zeroed;
//   <name>            the main kernel, below: one CTA per (BLOCK_N keys, K/V head, batch);
//   <name>_dq_convert dQ = scale * accumulator, in the inputs' type.
//
// The main kernel keeps its K and V tiles in shared memory and loops over the query tiles (BLOCK_M rows: Q, dO,
// lse and delta through a STAGES-deep ring) of every query head of its K/V head's GQA group whose rows see
// some of its keys. Each consumer warpgroup owns 64 keys (the M of every wgmma but dQ's) and per tile computes
// S^T, P^T, dP^T, dS^T, dV += P^T dO, dK += dS^T Q, stores dS^T to shared memory, and computes its share of the
// tile's dQ = dS K over all BN keys, added to the fp32 accumulator (attn_bwd_wgmma/tile.h, consumer.h). At BLOCK_M
// 80 (D128, the tiled dQ writer) each warpgroup computes dQ^T = K^T dS^T for its 64 of D instead (wgmma's M is 64,
// so 80 queries cannot be dQ's M), from dS stored queries x keys, into transposed 80 x 64 blocks of the accumulator.
// dK (times the scale) and dV go out once at the end, from registers.
//
// GQA as the sm_80 template: a CTA per K/V head loops over its group, dK and dV summed in registers (no fp32
// dK/dV buffers or atomics, deterministic). Causal masking is bottom-right aligned (query i at key position
// i + Sk - Sq), as the forward. No sliding windows or softcap in this version (the manifest says so).

#include "attn_bwd_mma/args.h"
#include "attn_bwd_mma/rows.h"
#include "attn_bwd_mma/tile.h"
#include "attn_bwd_wgmma/config.h"
#include "attn_bwd_wgmma/consumer.h"
#include "attn_bwd_wgmma/smem.h"
#include "attn_bwd_wgmma/tile.h"
#include "common/mask.h"
#include "common/ptx_sm80.h"
#include "common/ptx_sm90.h"
#include "common/utils.h"

namespace fc {

// Q, dO (rows past Sq zero-filled), lse_log2 and delta (rows padded to ROW_PAD: no bound) of a query tile into
// ring slot `st` when `valid`; one cp.async group, even when empty, so the wait counts stay fixed.
template <class C>
__device__ __forceinline__ void load_query_tile(const WgSmem<C>& sm, const BwdArgs& a, int b, QueryTile qt, int st,
                                                int sq_pad, bool valid) {
  using T = typename C::T;
  if (valid) {
    load_rows<C, C::BM>(sm.q(st), static_cast<const T*>(a.q) + b * a.q_sb + qt.h * a.q_sh, a.q_ss, qt.m0, a.sq);
    load_rows<C, C::BM>(sm.dout(st), static_cast<const T*>(a.dout) + b * a.do_sb + qt.h * a.do_sh, a.do_ss, qt.m0,
                        a.sq);
    const long long at = padded_row(a, b, qt.h, qt.m0, sq_pad);
    const int i = threadIdx.x;  // BM / 2 <= 64 < THREADS 16-byte chunks
    if (i < C::BM / 4) cp_async_16(sm.lse(st) + 4 * i, a.lse_log2 + at + 4 * i, true);
    else if (i < C::BM / 2) cp_async_16(sm.delta(st) + 4 * (i - C::BM / 4), a.delta + at + 4 * (i - C::BM / 4), true);
  }
  cp_async_commit();
}

// A warpgroup's dK (times `mul`) or dV rows, rounded to T, straight from the accumulators to global rows < Sk.
template <class C>
__device__ __forceinline__ void acc_to_global(typename C::T* dst, long long stride, const float* acc, float mul,
                                              int key0, int sk) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (key0 + 8 * h >= sk) continue;
    typename C::T* row = dst + (long long)(key0 + 8 * h) * stride + 2 * t;
#pragma unroll
    for (int nb = 0; nb < C::D / 8; ++nb)
      *reinterpret_cast<uint32_t*>(row + nb * 8) =
          pack2<typename C::T>(acc[nb * 4 + 2 * h] * mul, acc[nb * 4 + 2 * h + 1] * mul);
  }
}

// The CTA's first query row (the first row of its first query tile in each head).
template <class C>
__device__ __forceinline__ int first_query_row(int n0, const BwdArgs& a) {
  const int2 rows = query_range<typename C::Keys, C::CAUSAL>(n0, min(n0 + C::BN, a.sk), a.sk - a.sq, a.sq);
  return rows.x / C::BM * C::BM;
}

// The tile after qt (next_query_tile). FIRST_ROW_AT_WRAP: the next head's first row made again where the tiles
// wrap (once a head), from ctaid.x read by a volatile move that ptxas cannot merge with the first computation;
// else m_first, held across the loop.
template <class C>
__device__ __forceinline__ QueryTile next_tile(QueryTile qt, int m_first, int m_end, const BwdArgs& a) {
  if constexpr (!C::FIRST_ROW_AT_WRAP) {
    return next_query_tile(qt, m_first, m_end, C::BM);
  } else {
    if (qt.m0 + C::BM < m_end) return QueryTile{qt.h, qt.m0 + C::BM};
    unsigned x;
    asm volatile("mov.u32 %0, %%ctaid.x;\n" : "=r"(x));
    return QueryTile{qt.h + 1, first_query_row<C>((int)x * C::BN, a)};
  }
}

// PRODUCER: warpgroup 0 loads each query tile's Q and dO (TMA, rows past Sq zero-filled), lse_log2 and delta
// (bulk copies) into a STAGES-deep ring, completing on q_full; the consumers release a slot on q_empty once the
// tile's wgmmas are done. Launched by one elected thread.
template <class C>
__device__ __forceinline__ void produce(const WgSmem<C>& sm, const TmaDesc& tq, const TmaDesc& tdo, const BwdArgs& a,
                                        int b, QueryTile qt, int m_first, int m_end, int n_iters) {
  const int sq_pad = (a.sq + C::ROW_PAD - 1) / C::ROW_PAD * C::ROW_PAD;
  for (int it = 0; it < n_iters; ++it) {
    const int st = it % C::STAGES;
    if (it >= C::STAGES) mbar_wait(sm.q_empty(st), ((it / C::STAGES) & 1) ^ 1);
    const uint32_t full = sm.q_full(st);
    mbar_expect_tx(full, 2 * C::Q_BYTES + 2 * C::BM * 4);
#pragma unroll
    for (int cb = 0; cb < C::D / 64; ++cb) {
      tma_load(smem_u32(sm.q(st)) + cb * C::BM * 128, &tq, full, cb * 64, qt.m0, qt.h, b);
      tma_load(smem_u32(sm.dout(st)) + cb * C::BM * 128, &tdo, full, cb * 64, qt.m0, qt.h, b);
    }
    const long long at = padded_row(a, b, qt.h, qt.m0, sq_pad);
    bulk_load(sm.lse(st), a.lse_log2 + at, C::BM * 4, full);
    bulk_load(sm.delta(st), a.delta + at, C::BM * 4, full);
    qt = next_tile<C>(qt, m_first, m_end, a);
  }
}

// DQ_WRITER: warp 1 + cw of the producer warpgroup adds consumer cw's dQ blocks of each tile, staged in shared
// memory, to dq_accum (16-byte vector reductions, two rows a warp instruction; DQ_TILED: one bulk reduction of the
// whole 16 KB block), and hands the staging tiles back.
template <class C, int CW>
__device__ __forceinline__ void write_dq(const WgSmem<C>& sm, const BwdArgs& a, int b, QueryTile qt, int m_first,
                                         int m_end, int n_iters) {
  const int cw = CW >= 0 ? CW : (int)(threadIdx.x / 32) - 1;  // CW -1: the consumer is this warp's index - 1
  constexpr int PER = C::DQ_BLOCKS / C::NWG;
  const int lane = threadIdx.x % 32;
  for (int buf = 0; buf < C::DQ_BUFS; ++buf)  // every set is free before the first tile
    if (buf < n_iters) named_arrive(C::dq_free(cw, buf), C::DQ_SYNC);
  // Unrolled by the sets, so that each set's barrier ids and staging tiles are immediates.
  for (int it0 = 0; it0 < n_iters; it0 += C::DQ_BUFS) {
#pragma unroll
    for (int buf = 0; buf < C::DQ_BUFS; ++buf) {  // tile it's set: its ring slot (DQ_BUFS 2 only with 2 slots)
      const int it = it0 + buf;
      if (it >= n_iters) break;
      named_sync(C::dq_full(cw, buf), C::DQ_SYNC);
      float* rows = a.dq_accum + ((long long)b * a.heads + qt.h) * a.sq * C::D;
#pragma unroll
      for (int i = 0; i < PER; ++i) {
        const int blk = i * C::NWG + cw, mh = blk / (C::D / 64), c = blk % (C::D / 64);
        const float* stage = sm.dq_stage(cw * PER + i, buf);
        if constexpr (C::DQ_TILED) {  // the whole block, one bulk reduction (rows past Sq land in the padding)
          if (elect_one())
            bulk_reduce_add_f32(a.dq_accum + dq_index<C>(a, b, qt.h, qt.m0 + mh * 64, c * 64), stage, C::DQS_BYTES);
        } else {
#pragma unroll 4
          for (int j = 0; j < 32; ++j) {  // 64 rows of 16 float4, lanes along a row
            const int r = j * 2 + lane / 16, c4 = lane % 16, row = qt.m0 + mh * 64 + r;
            const float4 v = *reinterpret_cast<const float4*>(stage + r * C::DQS_STRIDE + c4 * 4);
            if (row < a.sq) red_add_v4(rows + (long long)row * C::D + c * 64 + c4 * 4, v);
          }
        }
      }
      if constexpr (C::DQ_TILED) {  // the staging tiles read before they are handed back
        bulk_commit();
        bulk_wait_read<0>();
        __syncwarp();
      }
      // The set goes back for tile it + DQ_BUFS (a hand-back past the last tile would have no taker).
      if (it + C::DQ_BUFS < n_iters) named_arrive(C::dq_free(cw, buf), C::DQ_SYNC);
      qt = next_tile<C>(qt, m_first, m_end, a);
    }
  }
  if constexpr (C::DQ_TILED) bulk_wait<0>();  // the staging tiles stay valid until the reductions are done
}

// DQ_T (BLOCK_M 80): write_dq of the one staging block in its two halves (DQ_HALVES, 10 KB each): half 0's bulk
// reduction goes out once consumer CW's warps 0-1 have staged it, half 1's once warps 2-3 have, and each half is
// handed back as soon as its own reduction has read it (one bulk group a half).
template <class C, int CW>
__device__ __forceinline__ void write_dq_halves(const WgSmem<C>& sm, const BwdArgs& a, int b, QueryTile qt,
                                                int m_first, int m_end, int n_iters) {
  constexpr int HALF = C::DQS_BYTES / 2;
  if (n_iters > 0) {  // both halves are free before the first tile
    named_arrive(C::dq_free(CW, 0), C::DQ_SYNC);
    named_arrive(C::dq_free(CW, 1), C::DQ_SYNC);
  }
  const float* stage = sm.dq_stage(CW);
  for (int it = 0; it < n_iters; ++it) {
    float* dst = a.dq_accum + dq_index<C>(a, b, qt.h, qt.m0, CW * 64);  // the block's first line
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      named_sync(C::dq_full(CW, h), C::DQ_SYNC);
      if (elect_one()) {
        bulk_reduce_add_f32(dst + h * HALF / 4, stage + h * HALF / 4, HALF);
        bulk_commit();
      }
    }
    const bool more = it + 1 < n_iters;  // a hand-back past the last tile would have no taker
    bulk_wait_read<1>();  // half 0 read (half 1's group may still be reading)
    __syncwarp();
    if (more) named_arrive(C::dq_free(CW, 0), C::DQ_SYNC);
    bulk_wait_read<0>();
    __syncwarp();
    if (more) named_arrive(C::dq_free(CW, 1), C::DQ_SYNC);
    qt = next_tile<C>(qt, m_first, m_end, a);
  }
  bulk_wait<0>();  // the staging tiles stay valid until the reductions are done
}

// The end of the rows whose query tiles the mask touches (Keys::partial): tiles m_first .. it are partial, those
// from it to m_end whole (causal: a tile whose first row's position is at or past the CTA's last key). No windows.
template <class C>
__device__ __forceinline__ int masked_rows_end(int n0, const BwdArgs& a, int m_first, int m_end) {
  static_assert(C::Keys::LEFT < 0 && C::Keys::RIGHT < 0, "the template has no sliding windows");
  if (n0 + C::BN > a.sk) return m_end;  // keys past Sk: every tile
  if constexpr (!C::CAUSAL) return m_first;
  const int row = n0 + C::BN - 1 - (a.sk - a.sq);  // partial while m0 + Sk - Sq < n0 + BN - 1
  return row <= m_first ? m_first : min(m_end, m_first + (row - m_first + C::BM - 1) / C::BM * C::BM);
}

// What a consumer's loop steps share.
template <class C>
struct ConsumerLoop {
  const WgSmem<C>& sm;
  const BwdArgs& a;
  const KeyBlock& kb;
  const RingBase<C>& rb;
  int b, sq_pad, m_first, m_end, n_iters;
  float scale_log2;
};

// Step `it` of a consumer's loop: query tile qt (MASK: whether a partial one), waited for, consumed, its slot
// released.
template <class C, Masking MASK>
__device__ __forceinline__ void consumer_step(const ConsumerLoop<C>& L, QueryTile qt, int it_, float* dk, float* dv) {
  const unsigned it = it_;  // unsigned: its slot, phase and parity without a signed division's fix-ups
  if constexpr (C::PRODUCER) {
    // Its slot's loads landed (TMA and bulk copies write through the async proxy: no fence); the dS^T tiles
    // alternate by tile, so a warpgroup a tile ahead never overwrites those another still reads.
    const int st = it % C::STAGES;
    mbar_wait(L.sm.q_full(st), (it / C::STAGES) & 1);
    consume_tile<C, MASK>(L.sm, L.a, L.kb, L.rb, L.b, qt, st, it % 2, st % C::DQ_BUFS, L.scale_log2, dk, dv);
    if (threadIdx.x % 32 == 0) mbar_arrive(L.sm.q_empty(st));
  } else {
    // One CTA barrier per tile, at its start, once its loads landed (and were fenced for wgmma's async proxy):
    // every warpgroup is then past the previous tile, so the other ring slot (refilled by the prefetch right
    // after it) and the dS^T tiles are free.
    if constexpr (C::STAGES == 2) {
      cp_async_wait<0>();  // this tile's group (prefetched during the previous one, or before the loop)
    } else {
      __syncthreads();  // every warpgroup is past the previous tile: the one slot is free
      load_query_tile<C>(L.sm, L.a, L.b, qt, 0, L.sq_pad, true);
      cp_async_wait<0>();
    }
    fence_proxy_async();
    __syncthreads();
    if constexpr (C::STAGES == 2)
      load_query_tile<C>(L.sm, L.a, L.b, next_query_tile(qt, L.m_first, L.m_end, C::BM), (it + 1) % 2, L.sq_pad,
                         it_ + 1 < L.n_iters);
    consume_tile<C, MASK>(L.sm, L.a, L.kb, L.rb, L.b, qt, it % C::STAGES, 0, 0, L.scale_log2, dk, dv);
  }
}

template <class C>
__device__ __forceinline__ void attn_bwd_wgmma(const TmaDesc& tq, const TmaDesc& tdo, const BwdArgs& a) {
  using T = typename C::T;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const WgSmem<C> sm{smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023)};
  // The warpgroup index broadcast from lane 0, so that ptxas can prove it warp-uniform and keeps the warpgroup's
  // shared-memory descriptors on the uniform datapath (else two R2UR and an add per wgmma). Not at BLOCK_M 128:
  // it spilled there.
  const int wg = C::WG_BROADCAST ? __shfl_sync(0xffffffff, threadIdx.x / 128, 0) : threadIdx.x / 128;
  const int cw = C::PRODUCER ? wg - 1 : wg;  // consumer warpgroup (-1: the producer)
  const int hk = blockIdx.y, b = blockIdx.z;
  const int n0 = blockIdx.x * C::BN;
  const int sq_pad = (a.sq + C::ROW_PAD - 1) / C::ROW_PAD * C::ROW_PAD;

  // The query tiles whose rows see some of the keys, in each query head of the group.
  const int2 rows = query_range<typename C::Keys, C::CAUSAL>(n0, min(n0 + C::BN, a.sk), a.sk - a.sq, a.sq);
  const int m_begin = rows.x / C::BM;
  const int n_m = rows.y > rows.x ? (rows.y + C::BM - 1) / C::BM - m_begin : 0;
  const int n_iters = n_m * a.h_per_kv;
  const int m_first = m_begin * C::BM, m_end = (m_begin + n_m) * C::BM;
  QueryTile qt = query_tile(0, hk, a.h_per_kv, m_begin, max(n_m, 1), C::BM);

  load_rows<C, C::BN>(sm.k(), static_cast<const T*>(a.k) + b * a.k_sb + hk * a.k_sh, a.k_ss, n0, a.sk);
  load_rows<C, C::BN>(sm.v(), static_cast<const T*>(a.v) + b * a.v_sb + hk * a.v_sh, a.v_ss, n0, a.sk);
  if constexpr (C::PRODUCER) {
    if (threadIdx.x == 0) sm.init_barriers();
    cp_async_commit();
  } else if constexpr (C::STAGES == 2) {
    load_query_tile<C>(sm, a, b, qt, 0, sq_pad, n_iters > 0);
  } else {
    cp_async_commit();
  }
  if constexpr (C::PRODUCER) {
    cp_async_wait<0>();  // K and V
    fence_proxy_async();
    __syncthreads();
    if (cw < 0) {
      if constexpr (C::NWG > 1) setmaxnreg_dec<C::PRODUCER_REGS>();
      const int warp = threadIdx.x / 32;
      if (warp == 0 && elect_one()) produce<C>(sm, tq, tdo, a, b, qt, m_first, m_end, n_iters);
      // DQ_TILED: each writer's consumer a template argument, so that its two sets' barrier ids and staging tiles
      // are immediates (these warps run at 24 registers: held in registers, they spilled); the row-by-row writer
      // takes it from the warp index (one copy of its code: two spilled).
      if constexpr (C::DQ_T) {
        if (warp == 1) write_dq_halves<C, 0>(sm, a, b, qt, m_first, m_end, n_iters);
        if (warp == 2) write_dq_halves<C, 1>(sm, a, b, qt, m_first, m_end, n_iters);
      } else if constexpr (C::DQ_TILED) {
        if (warp == 1) write_dq<C, 0>(sm, a, b, qt, m_first, m_end, n_iters);
        if constexpr (C::NWG > 1)
          if (warp == 2) write_dq<C, 1>(sm, a, b, qt, m_first, m_end, n_iters);
      } else if constexpr (C::DQ_WRITER) {
        if (warp >= 1 && warp <= C::NWG) write_dq<C, -1>(sm, a, b, qt, m_first, m_end, n_iters);
      }
      return;
    }
    if constexpr (C::NWG > 1) setmaxnreg_inc<C::CONSUMER_REGS>();
  }

  const KeyBlock kb = key_block<C>(sm, n0, cw);
  const RingBase<C> rb = ring_base<C>(sm, cw);
  float dk[C::D / 2], dv[C::D / 2];
#pragma unroll
  for (int i = 0; i < C::D / 2; ++i) dk[i] = dv[i] = 0.f;
  const float scale_log2 = a.scale * LOG2E;

  // Each head's tiles in two loops: first those the mask touches (causal: the few at the diagonal; all where the
  // CTA's keys run past Sk), then the rest, which run no mask code (FlashAttention-3 and -4 split theirs alike; in
  // one loop the mask's test and bounds ran on every tile). The order is the producer's (next_tile).
  const ConsumerLoop<C> loop{sm, a, kb, rb, b, sq_pad, m_first, m_end, n_iters, scale_log2};
  if constexpr (C::SPLIT_MASK) {
    const int m_masked = masked_rows_end<C>(n0, a, m_first, m_end);
    int it = 0;
    for (int h = hk * a.h_per_kv; h < (hk + 1) * a.h_per_kv; ++h) {
      int m0 = m_first;
      for (; m0 < m_masked; m0 += C::BM, ++it) consumer_step<C, Masking::PARTIAL>(loop, {h, m0}, it, dk, dv);
      for (; m0 < m_end; m0 += C::BM, ++it) consumer_step<C, Masking::WHOLE>(loop, {h, m0}, it, dk, dv);
    }
  } else {  // one loop over the tiles in the producer's order, each tested (as nested loops, BLOCK_M 128 spilled)
    for (int it = 0; it < n_iters; ++it) {
      const QueryTile next = next_tile<C>(qt, m_first, m_end, a);
      consumer_step<C, Masking::TEST>(loop, qt, it, dk, dv);
      qt = next;
    }
  }
  cp_async_wait<0>();
  if constexpr (C::CONSUMER_BULK) bulk_wait<0>();  // the staging tiles stay valid until the reductions are done

  acc_to_global<C>(static_cast<T*>(a.dk) + b * a.dk_sb + hk * a.dk_sh, a.dk_ss, dk, a.scale, kb.key0, a.sk);
  acc_to_global<C>(static_cast<T*>(a.dv) + b * a.dv_sb + hk * a.dv_sh, a.dv_ss, dv, 1.f, kb.key0, a.sk);
}

}  // namespace fc

// The tuner appends, for one variant (tuner/kernels/render.py), the three entry points:
//   using TunerCfg = fc::BwdWgmmaConfig<...>;
//   extern "C" __global__ void __launch_bounds__(TunerCfg::THREADS, TunerCfg::MIN_BLOCKS) <name>(ATTN_BWD_PARAMS)
//   { ATTN_BWD_BODY(TunerCfg) }
//   extern "C" __global__ void __launch_bounds__(TunerCfg::AUX_THREADS) <name>_dot_do_o(ATTN_BWD_PARAMS) ...
// Every entry point takes the TMA maps of Q and dO first (64-byte aligned parameters; encoded by the launcher as
// the forward's, boxes of 64 elements x BLOCK_M rows, 128-byte swizzle), then the sm_80 template's list; only the
// PRODUCER loop reads the maps.
#undef ATTN_BWD_PARAMS
#define ATTN_BWD_PARAMS                                                                                        \
  const __grid_constant__ fc::TmaDesc tmap_q, const __grid_constant__ fc::TmaDesc tmap_do, ATTN_BWD_PARAMS_LIST
#define ATTN_BWD_BODY(CFG) fc::attn_bwd_wgmma<CFG>(tmap_q, tmap_do, ATTN_BWD_ARGS);
#define ATTN_BWD_BODY_DOT_DO_O(CFG) fc::bwd_dot_do_o<CFG>(ATTN_BWD_ARGS);
#define ATTN_BWD_BODY_DQ_CONVERT(CFG) fc::bwd_dq_convert<CFG>(ATTN_BWD_ARGS);
