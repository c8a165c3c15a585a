// FlashAttention-2-style attention backward pass for sm_80 and newer (mma.sync m16n8k16, ldmatrix, cp.async).
//
// Three kernels, one parameter list (attn_bwd_mma/args.h), launched in order by tuner/runtime/backward_launch.py:
//   <name>_dot_do_o   delta = rowsum(dO * O) (fp32), lse in log2 units, dQ's fp32 accumulator zeroed (rows.h);
//   <name>            the main kernel, below: one CTA per (BLOCK_N keys, K/V head, batch);
//   <name>_dq_convert dQ = scale * accumulator, in the inputs' type (rows.h).
//
// The main kernel keeps its K and V tiles in shared memory and loops over the query tiles (BLOCK_M rows, Q, dO, lse
// and delta through a STAGES-deep cp.async ring) of every query head of its K/V head's GQA group, those whose rows
// see some of its keys. Per tile, each warp (its share of the keys) recomputes S^T = K Q^T, P^T = exp2(S^T scale
// log2(e) - lse log2(e)) from the forward's lse, dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - delta),
// dK += dS^T Q (attn_bwd_mma/tile.h, common/warp_tile.h's products); dS^T goes to shared memory and all warps
// compute the tile's dQ = dS K, added to the fp32 accumulator with atomics (attn_bwd_mma/dq.h). dK (times the
// scale) and dV are written once at the end (attn_bwd_mma/epilogue.h).
//
// GQA: a CTA per K/V head looping over its group keeps dK and dV in registers across the group (summed there, no
// fp32 dK/dV buffers, atomics or conversion pass, deterministic), at the cost of group-times fewer CTAs than a CTA
// per query head; B * Hkv * Sk / BLOCK_N CTAs fill a card at training shapes.
//
// Masks (common/mask.h) are the forward's, bottom-right aligned: query i is at key position i + Sk - Sq. The lse
// convention is the forward's (attn_fwd_mma/epilogue.h): natural log of sum_j exp(logit_j), logit = S * scale (a
// softcap's cap * tanh(S * scale / cap)), -inf for a row that sees no key (its gradients are 0).

#include "attn_bwd_mma/args.h"
#include "attn_bwd_mma/config.h"
#include "attn_bwd_mma/dq.h"
#include "attn_bwd_mma/epilogue.h"
#include "attn_bwd_mma/rows.h"
#include "attn_bwd_mma/tile.h"
#include "attn_fwd_mma/load_tile.h"
#include "common/mask.h"
#include "common/ptx_sm80.h"
#include "common/utils.h"
#include "common/warp_tile.h"

namespace fc {

// The main kernel's shared tiles: K, V; STAGES slots of Q, dO, lse_log2 and delta; dS^T.
template <class C>
struct BwdSmem {
  using T = typename C::T;
  T *k, *v, *q, *dout, *ds;
  float *lse, *delta;
  __device__ __forceinline__ explicit BwdSmem(unsigned char* raw) {
    k = reinterpret_cast<T*>(raw);
    v = k + C::KV_TILE;
    q = v + C::KV_TILE;
    dout = q + C::STAGES * C::Q_TILE;
    ds = dout + C::STAGES * C::Q_TILE;
    lse = reinterpret_cast<float*>(ds + C::DS_TILE);
    delta = lse + C::STAGES * C::BM;
  }
};

// Q, dO (rows past Sq zero-filled), lse_log2 and delta (padded rows: no bound) of a query tile into ring slot
// `stage` when `valid`; one cp.async group, even when empty, so the wait counts stay fixed.
template <class C>
__device__ __forceinline__ void load_query_tile(const BwdSmem<C>& sm, const BwdArgs& a, int b, QueryTile qt, int stage,
                                                int sq_pad, bool valid) {
  using T = typename C::T;
  if (valid) {
    load_tile<C, C::BM>(sm.q + stage * C::Q_TILE, static_cast<const T*>(a.q) + b * a.q_sb + qt.h * a.q_sh, a.q_ss,
                        qt.m0, a.sq);
    load_tile<C, C::BM>(sm.dout + stage * C::Q_TILE, static_cast<const T*>(a.dout) + b * a.do_sb + qt.h * a.do_sh,
                        a.do_ss, qt.m0, a.sq);
    const long long at = padded_row(a, b, qt.h, qt.m0, sq_pad);
    const int i = threadIdx.x;  // BM / 2 <= 64 <= THREADS 16-byte chunks
    if (i < C::BM / 4) cp_async_16(sm.lse + stage * C::BM + 4 * i, a.lse_log2 + at + 4 * i, true);
    else if (i < C::BM / 2) cp_async_16(sm.delta + stage * C::BM + 4 * (i - C::BM / 4), a.delta + at + 4 * (i - C::BM / 4), true);
  }
  cp_async_commit();
}

// A thread's shared-memory addressing (see TileLayout::addr), fixed for the kernel: K and V as the A operand of
// S^T and dP^T (the warp's keys), Q and dO as B (queries: non-transposed for K Q^T and V dO^T, transposed for
// P^T dO and dS^T Q), each a row base offset and a chunk offset.
struct BwdAddr {
  uint32_t a_off, a_cb, b_off, b_cb, bt_off, bt_cb;
};
template <class C>
__device__ __forceinline__ BwdAddr bwd_addr(int key_base, int lane) {
  using L = typename C::Layout;
  const int a_row = key_base + lane % 8 + ((lane / 8) % 2) * 8;
  const int b_row = (lane / 16) * 8 + lane % 8;
  const int bt_row = ((lane / 8) % 2) * 8 + lane % 8;
  return BwdAddr{(uint32_t)(a_row * L::ROW_BYTES), L::chunk_bytes(a_row, lane / 16), (uint32_t)(b_row * L::ROW_BYTES),
                 L::chunk_bytes(b_row, (lane / 8) % 2), (uint32_t)(bt_row * L::ROW_BYTES), L::chunk_bytes(bt_row, lane / 16)};
}

// What a warp accumulates over the loop: its keys' dK and dV.
template <class C>
struct BwdAcc {
  float dk[C::MT][C::DT][4], dv[C::MT][C::DT][4];
};

// One query tile (in ring slot `stage`) against the warp's keys: dV and dK accumulated, dS^T stored for dQ.
template <class C>
__device__ __forceinline__ void tile_dkdv(BwdAcc<C>& acc, const BwdSmem<C>& sm, const BwdAddr& ad, int stage,
                                          bool partial, int key0, int q_pos0, int key_base, int sk, float cap_pre,
                                          float scale_log2) {
  using T = typename C::T;
  using L = typename C::Layout;
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const uint32_t q_base = smem_u32(sm.q + stage * C::Q_TILE), do_base = smem_u32(sm.dout + stage * C::Q_TILE);
  const uint32_t k_a = smem_u32(sm.k) + ad.a_off, v_a = smem_u32(sm.v) + ad.a_off;
  auto load_k = [&](uint32_t(&f)[4], int mt, int kd) { ldmatrix_x4(f, L::addr(k_a, ad.a_cb, mt * 16, kd * 16)); };
  auto load_v = [&](uint32_t(&f)[4], int mt, int kd) { ldmatrix_x4(f, L::addr(v_a, ad.a_cb, mt * 16, kd * 16)); };

  // S^T = K Q^T, then P^T (softcapped, masked, exponentiated against lse).
  float p[C::MT][C::NT][4];
  float dtanh[C::Cap::ON ? C::MT : 1][C::Cap::ON ? C::NT : 1][4];
  warp_qk<T, L, C::MT, C::NT, C::KD>(p, load_k, q_base + ad.b_off, ad.b_cb);
  scores_to_p<C>(p, dtanh, sm.lse + stage * C::BM, partial, key0, q_pos0, g, t, sk, cap_pre, scale_log2);
  // dV += P^T dO
  warp_pv<T, L, C::MT, C::NT, C::DT>(acc.dv, p, do_base + ad.bt_off, ad.bt_cb);
  // dP^T = V dO^T, then dS^T = P^T (dP^T - delta); dK += dS^T Q
  float ds[C::MT][C::NT][4];
  warp_qk<T, L, C::MT, C::NT, C::KD>(ds, load_v, do_base + ad.b_off, ad.b_cb);
  dp_to_ds<C>(ds, p, dtanh, sm.delta + stage * C::BM, t);
  warp_pv<T, L, C::MT, C::NT, C::DT>(acc.dk, ds, q_base + ad.bt_off, ad.bt_cb);
  store_ds<C>(sm.ds, ds, key_base, g, t);
}

template <class C>
__device__ __forceinline__ void attn_bwd(const BwdArgs& a) {
  using T = typename C::T;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const BwdSmem<C> sm(smem_raw);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int hk = blockIdx.y, b = blockIdx.z;
  const int n0 = blockIdx.x * C::BN, diag = a.sk - a.sq;
  const int sq_pad = (a.sq + C::ROW_PAD - 1) / C::ROW_PAD * C::ROW_PAD;
  const int key_base = warp * C::KEYS_PER_WARP;

  // The query tiles whose rows see some of the keys, in each query head of the group.
  const int2 rows = query_range<typename C::Keys, C::CAUSAL>(n0, min(n0 + C::BN, a.sk), diag, a.sq);
  const int m_begin = rows.x / C::BM;
  const int n_m = rows.y > rows.x ? (rows.y + C::BM - 1) / C::BM - m_begin : 0;
  const int n_iters = n_m * a.h_per_kv;

  load_tile<C, C::BN>(sm.k, static_cast<const T*>(a.k) + b * a.k_sb + hk * a.k_sh, a.k_ss, n0, a.sk);
  load_tile<C, C::BN>(sm.v, static_cast<const T*>(a.v) + b * a.v_sb + hk * a.v_sh, a.v_ss, n0, a.sk);
  if constexpr (C::STAGES == 2)
    load_query_tile<C>(sm, a, b, query_tile(0, hk, a.h_per_kv, m_begin, max(n_m, 1), C::BM), 0, sq_pad, n_iters > 0);
  else
    cp_async_commit();

  const BwdAddr ad = bwd_addr<C>(key_base, lane);
  BwdAcc<C> acc;
  zero_acc(acc.dk);
  zero_acc(acc.dv);
  const float scale_log2 = C::Cap::softmax_scale(a.scale) * LOG2E, cap_pre = C::Cap::pre_scale(a.scale);

  // Barriers per tile: one after its loads landed (every warp is then also past the previous tile's dQ, so dS^T
  // and, with STAGES == 1, the only slot may be overwritten), one between dS^T's stores and dQ's reads. The
  // prefetch into the other slot is issued after the previous tile's second barrier: its reads of that slot
  // (S^T .. dK) are all done.
  for (int it = 0; it < n_iters; ++it) {
    const QueryTile qt = query_tile(it, hk, a.h_per_kv, m_begin, n_m, C::BM);
    int stage = 0;
    if constexpr (C::STAGES == 2) {
      stage = it % 2;
      load_query_tile<C>(sm, a, b, query_tile(it + 1, hk, a.h_per_kv, m_begin, n_m, C::BM), (it + 1) % 2, sq_pad,
                         it + 1 < n_iters);
      cp_async_wait<1>();
    } else {
      load_query_tile<C>(sm, a, b, qt, 0, sq_pad, true);
      cp_async_wait<0>();
    }
    __syncthreads();
    const int q_pos0 = qt.m0 + diag;
    const bool partial = C::Keys::partial(n0, C::BN, q_pos0, q_pos0 + C::BM - 1, a.sk);
    tile_dkdv<C>(acc, sm, ad, stage, partial, n0 + key_base, q_pos0, key_base, a.sk, cap_pre, scale_log2);
    __syncthreads();
    tile_dq<C>(smem_u32(sm.ds), smem_u32(sm.k), a.dq_accum + ((long long)b * a.heads + qt.h) * a.sq * C::D, qt.m0,
               a.sq, warp, lane);
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with K and V (dQ reads K)

  const int g = lane / 4, t = lane % 4;
  acc_to_tile<C>(sm.k, acc.dk, a.scale, key_base, g, t);
  acc_to_tile<C>(sm.v, acc.dv, 1.f, key_base, g, t);
  __syncthreads();
  tile_to_global<C>(static_cast<T*>(a.dk) + b * a.dk_sb + hk * a.dk_sh, a.dk_ss, sm.k, n0, a.sk);
  tile_to_global<C>(static_cast<T*>(a.dv) + b * a.dv_sb + hk * a.dv_sh, a.dv_ss, sm.v, n0, a.sk);
}

}  // namespace fc

// The tuner appends, for one variant (tuner/kernels/render.py), the three entry points:
//   using TunerCfg = fc::BwdConfig<...>;
//   extern "C" __global__ void __launch_bounds__(TunerCfg::AUX_THREADS) <name>_dot_do_o(ATTN_BWD_PARAMS)
//   { ATTN_BWD_BODY_DOT_DO_O(TunerCfg) }
//   extern "C" __global__ void __launch_bounds__(TunerCfg::THREADS, TunerCfg::MIN_BLOCKS) <name>(ATTN_BWD_PARAMS)
//   { ATTN_BWD_BODY(TunerCfg) }
//   extern "C" __global__ void __launch_bounds__(TunerCfg::AUX_THREADS) <name>_dq_convert(ATTN_BWD_PARAMS)
//   { ATTN_BWD_BODY_DQ_CONVERT(TunerCfg) }
#define ATTN_BWD_BODY(CFG) fc::attn_bwd<CFG>(ATTN_BWD_ARGS);
#define ATTN_BWD_BODY_DOT_DO_O(CFG) fc::bwd_dot_do_o<CFG>(ATTN_BWD_ARGS);
#define ATTN_BWD_BODY_DQ_CONVERT(CFG) fc::bwd_dq_convert<CFG>(ATTN_BWD_ARGS);
