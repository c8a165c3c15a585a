// The consumer warpgroups' main loop: for each work item, its 64 query rows
// against the item's K/V tiles: S = Q K^T with wgmma (both operands in shared
// memory, K-major), online softmax in registers (exp2), O += P V with wgmma
// (P from registers, V read MN-major straight from the TMA tile: no
// transpose pass); then the epilogue (epilogue.h).
#pragma once

#include <stdint.h>

#include "../common/attn_args.h"
#include "../common/utils.h"
#include "config.h"
#include "epilogue.h"
#include "item_mail.h"
#include "../common/ptx_sm90.h"
#include "tile_scheduler.h"
#include "wgmma_generated.h"

namespace fc {

// D256 packed persistent kernels: the Q descriptor is made again each tile (StageDescs::query), and each step's
// descriptors are one 64-bit add. Hoisted out of the loop, the 16 steps' Q descriptors took the uniform registers
// that the K descriptors then lacked (R2UR 13 in the loop, and 64 bytes of spills; benchmarks/NOTES.md, session
// 26). Dense D256 kernels keep theirs hoisted (not timed without it).
template <class C>
inline constexpr bool Q_PER_TILE = C::D > 128 && C::PACKED && C::PERSISTENT;

// S = Q K^T for one warpgroup: 64 x BN, D/KSTEP wgmma steps along the head dim. `qd`, `kd`: the descriptors of
// the warpgroup's Q rows and of the K tile's stage (StageDescs).
template <class C>
__device__ __forceinline__ void issue_qk(float* s, uint64_t qd, uint64_t kd) {
#pragma unroll
  for (int kk = 0; kk < C::D / C::KSTEP; ++kk) {
    // column block, bytes into its row
    const uint32_t cb = kk * C::KSTEP / C::E, off = (kk * C::KSTEP) % C::E * C::ES;
    // D256: 16 steps of two descriptors each would spill uniform registers (R2UR in the loop), unless Q_PER_TILE
    constexpr bool WIDE = (C::D <= 128 && !C::FP8) || Q_PER_TILE<C>;
    const uint64_t da = desc_advance<WIDE>(qd, cb * C::BM * C::SWB + off);
    const uint64_t db = desc_advance<WIDE>(kd, cb * C::BN * C::SWB + off);
    if constexpr (C::FP8)
      Wgmma<C::BN>::ss8(s, da, db, kk > 0 ? 1 : 0);
    else
      Wgmma<C::BN>::template ss<C::BF16, 0>(s, da, db, kk > 0 ? 1 : 0);
  }
}

// O += P V: BN/KSTEP wgmma steps along the keys; `vd`: the descriptor of the V tile's stage (StageDescs). A
// 16-bit V is [BN][D] in the ring, i.e. MN-major for this product (the transpose flag of the instruction); an
// FP8 V is V^T, [D][BN] in CBV column blocks of keys: K-major, as FP8 wgmma needs.
// `accumulate` false (an item's first tile): O = P V, so O needs no zeroing first.
template <class C>
__device__ __forceinline__ void issue_pv(float* o, const uint32_t (*p)[4], uint64_t vd, bool accumulate) {
  if constexpr (C::FP8) {
#pragma unroll
    for (int kk = 0; kk < C::BN / C::KSTEP; ++kk) {
      const uint32_t cb = kk * C::KSTEP / C::E, off = (kk * C::KSTEP) % C::E;
      Wgmma<C::D>::rs8(o, p[kk], desc_advance<false>(vd, cb * C::D * C::SWB + off), kk > 0 || accumulate);
    }
  } else {
#pragma unroll
    for (int kk = 0; kk < C::BN / 16; ++kk) {
      const uint64_t dv = desc_advance(vd, kk * 16 * C::SWB);
      Wgmma<C::D>::template rs<C::BF16>(o, p[kk], dv, kk > 0 || accumulate);
    }
  }
}

// Each ring stage's K and V descriptors, made once per CTA; a tile picks its stage's (a select, as FA4 does).
// Made in the loop from the slot they cost ~12 uniform instructions a tile more: the slot's shift and mask,
// the descriptor's address mask and shift, and (the compiler knowing the low bits clear) ORs for the first
// wgmma steps whose pairs then each need a UMOV of the high word. `opaque` (ptx_sm90.h) hides those bits, so
// every step's pair is one 64-bit add.
template <class C>
struct StageDescs {
  // D256's 16 Q K^T steps leave too few uniform registers to hold the stages' pairs too (R2UR 4 -> 17 in its
  // loop): it makes its descriptors in the loop, from the slot and from the Q rows' address, as before.
  static constexpr bool HELD = C::D <= 128;
  uint64_t k[C::STAGES], v[C::STAGES], q;
  uint32_t sK, sV, q_base;

  // Q and K tiles: K-major (16-bit and FP8 alike); V: MN-major for 16-bit, K-major as FP8 V^T.
  __device__ __forceinline__ static uint64_t kmajor_desc(uint32_t addr) {
    return make_desc<C::SWB>(addr, 16, 8 * C::SWB);
  }
  __device__ __forceinline__ static uint64_t v_desc(uint32_t addr) {
    return C::FP8 ? kmajor_desc(addr) : make_desc<C::SWB>(addr, C::BN * C::SWB, 8 * C::SWB);
  }

  // `q_rows`: the address of the warpgroup's Q rows.
  __device__ __forceinline__ StageDescs(const SmemLayout<C>& sm, uint32_t q_rows)
      : sK(sm.sK), sV(sm.sV), q_base(q_rows) {
    if constexpr (HELD) {
      q = kmajor_desc(q_rows);
#pragma unroll
      for (int st = 0; st < C::STAGES; ++st) {
        k[st] = opaque(kmajor_desc(sm.sK + st * C::KV_BYTES));
        v[st] = opaque(v_desc(sm.sV + st * C::KV_BYTES));
      }
    }
  }
  // A chain of selects (an array indexed at run time would live in local memory).
  __device__ __forceinline__ static uint64_t pick(const uint64_t (&d)[C::STAGES], uint32_t slot) {
    uint64_t found = d[0];
#pragma unroll
    for (int st = 1; st < C::STAGES; ++st) found = slot == static_cast<uint32_t>(st) ? d[st] : found;
    return found;
  }
  __device__ __forceinline__ uint64_t query() const {
    if constexpr (HELD) return q;
    uint64_t d = kmajor_desc(q_base);
    if constexpr (Q_PER_TILE<C>) asm volatile("" : "+l"(d));  // not hoisted out of the loop
    return d;
  }
  __device__ __forceinline__ uint64_t key(uint32_t slot) const {
    if constexpr (HELD) return pick(k, slot);
    return kmajor_desc(sK + slot * C::KV_BYTES);
  }
  __device__ __forceinline__ uint64_t value(uint32_t slot) const {
    if constexpr (HELD) return pick(v, slot);
    return v_desc(sV + slot * C::KV_BYTES);
  }
};

// Accumulator element e of a 64 x N wgmma tile held by a thread: column
// block e / 4 (8 columns), row half (e / 2) % 2 (+8 rows), column pair e % 2.
// Positions are taken relative to the thread's first column (hidden() compares differences only), so each
// element is one compare of a register with its immediate offset: no column index per element. Causal: a key
// past the end is right of every row that is stored (row < sq: position < sk), so that bound is left out;
// the rows past sq it would hide see finite keys (zeros or the next packed sequence's), never stored.
template <class C>
__device__ __forceinline__ void mask_tile(float* s, int kv0, int row0, int lane, int sq, int sk) {
  const int col0 = kv0 + (lane % 4) * 2;
  const int end = C::CAUSAL ? INT_MAX : sk - col0;
#pragma unroll
  for (int e = 0; e < C::BN / 2; ++e) {
    const int p = row0 + ((e / 2) % 2) * 8 + sk - sq - col0;
    if (C::Keys::hidden((e / 4) * 8 + (e % 2), p, end)) s[e] = NEG_INF;
  }
}

// Online softmax on one tile, in place: s becomes P = exp2(s * scale_log2 -
// m) with m the new running row max (scaled); corr is the factor the earlier
// O and row sums must be multiplied by. `between` runs after the row max and before the exp2s: the FP8 loop
// waits there for P_{j-1} V_{j-1}, so that P_j's conversions can be scheduled among the exp2s (FA4's order).
// The O rescale placed there too (FA4 does) was slower on 16-bit tiles: ptxas left its 64 multiplies in a
// block after the exp2s instead of under Q K_j^T (H200, session 22: 0.95-0.97x the rotated loop). The FP8
// wait there: e4m3 1.19x FA4's fp16 against 1.16x with the wait after the softmax and P packed in a block.
// `first` (a constant where inlined): an item's first tile, with no running max and sum to fold in (corr 0).
template <class C, class Between>
__device__ __forceinline__ void softmax_tile(float* s, float (&row_max)[2], float (&row_sum)[2], float (&corr)[2],
                                             float scale_log2, Between&& between, bool first) {
  constexpr float P_SHIFT = static_cast<float>(C::P_SHIFT);
  // A row's max and sum are taken in NP interleaved partials, then combined: one running value made each FMNMX
  // and FADD wait for the one before it (ncu, H200: FADD and F2FP the top fixed-latency waits besides MUFU, where
  // FA4's have almost none). Exact for the max; the sum's order changes within fp32 rounding.
  constexpr int PAIRS = C::BN / 8;  // a row's column pairs in this thread's fragment
  constexpr int NP = PAIRS < 4 ? PAIRS : 4;
  float p_off[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float mp[NP];
#pragma unroll
    for (int k = 0; k < PAIRS; ++k) {
      const int e = 2 * i + 4 * k;
      const float pair = fmaxf(s[e], s[e + 1]);
      mp[k % NP] = k < NP ? pair : fmaxf(mp[k % NP], pair);
    }
    float m = first ? mp[0] : fmaxf(row_max[i], mp[0]);
#pragma unroll
    for (int k = 1; k < NP; ++k) m = fmaxf(m, mp[k]);
    m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 2));
    const float m_scaled = (m == NEG_INF) ? 0.f : m * scale_log2;
    corr[i] = first ? 0.f : fast_exp2(row_max[i] * scale_log2 - m_scaled);
    row_max[i] = m;
    p_off[i] = m_scaled - P_SHIFT;  // P's exponent: 2^P_SHIFT larger (FP8), else the same
  }
  between();
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float sp[NP];
#pragma unroll
    for (int k = 0; k < PAIRS; ++k) {
      const int e = 2 * i + 4 * k;
      s[e] = fast_exp2(fmaf(s[e], scale_log2, -p_off[i]));
      s[e + 1] = fast_exp2(fmaf(s[e + 1], scale_log2, -p_off[i]));
      const float pair = s[e] + s[e + 1];
      sp[k % NP] = k < NP ? pair : sp[k % NP] + pair;
    }
    float sum = sp[0];
#pragma unroll
    for (int k = 1; k < NP; ++k) sum += sp[k];
    row_sum[i] = first ? sum : row_sum[i] * corr[i] + sum;  // this thread's columns only; the quad is summed at the end
  }
}

template <class C>
__device__ __forceinline__ void rescale_o(float* o, const float (&corr)[2]) {
#pragma unroll
  for (int e = 0; e < C::D / 2; ++e) o[e] *= corr[(e / 2) % 2];
}

// 16-bit: the S accumulator of columns 16kk..16kk+15 is exactly the A fragment of the k-step kk of P V
// (wgmma's register A layout matches its D layout).
// FP8: a k32 A fragment holds, per thread, 4 bytes of columns 4t..4t+3 (t = lane % 4) in registers 0
// (row r) and 1 (row r + 8), and of 16 + 4t..16 + 4t + 3 in 2 and 3; the S accumulator holds columns
// 2t, 2t + 1 of each 8. Each register takes the thread's own two pairs of two adjacent 8-column blocks,
// so fragment column 4t + i of each 16 holds key 2t + i % 2 + 8 (i / 2): the launcher's V^T copy puts
// its keys in that order (no shuffles here).
template <class C>
__device__ __forceinline__ void pack_p(uint32_t (*p)[4], const float* s) {
  if constexpr (C::FP8) {
#pragma unroll
    for (int kk = 0; kk < C::BN / 32; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float* x = s + 16 * kk + 8 * (r / 2) + 2 * (r % 2);  // blocks 4kk + 2(r/2), +1; row half r % 2
        p[kk][r] = pack4_e4m3(x[0], x[1], x[4], x[5]);
      }
  } else {
#pragma unroll
    for (int kk = 0; kk < C::BN / 16; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) p[kk][r] = pack2<typename C::T>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
  }
}

// `to` = `from` where `take` (TWO_P's last P, in either set).
template <class C>
__device__ __forceinline__ void copy_p(uint32_t (*to)[4], const uint32_t (*from)[4], bool take) {
#pragma unroll
  for (int kk = 0; kk < C::BN / C::KSTEP; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) to[kk][r] = take ? from[kk][r] : to[kk][r];
}

// q_descale x k_descale of the work item's (batch, K/V head); 1 for 16-bit inputs.
template <class C>
__device__ __forceinline__ float qk_descale(const AttnArgs& a, const Work& it) {
  if constexpr (C::FP8) {
    const int i = it.b * (a.heads / a.h_per_kv) + it.h / a.h_per_kv;
    return a.q_descale[i] * a.k_descale[i];
  }
  return 1.f;
}

// Ping-pong turns: consumer c issues its tensor-core work after consumer
// c - 1 (cyclically) has issued its own; consumer 0 goes first.
template <class C>
struct Turns {
  int cw;
  __device__ __forceinline__ void start(bool any_work) const {
    if constexpr (C::PINGPONG)
      if (any_work && cw == C::CONSUMERS - 1) named_arrive(1, 256);
  }
  __device__ __forceinline__ void acquire() const {
    if constexpr (C::PINGPONG) named_sync(1 + cw, 256);
  }
  __device__ __forceinline__ void release(bool last) const {
    // The last consumer's final hand-over would have no taker.
    if constexpr (C::PINGPONG)
      if (!(last && cw == C::CONSUMERS - 1)) named_arrive(1 + (cw + 1) % C::CONSUMERS, 256);
  }
};

// A consumer warpgroup (cw = 0..CONSUMERS-1, 64 query rows of each work
// item). Per item: wait for its Q rows, run over its K/V tiles (O, row max
// and row sum of this thread's columns stay in registers), then hand them
// to the epilogue.
//
// Without OVERLAP a tile is Q K^T, softmax, P V, one after the other. With
// OVERLAP, tile j's softmax runs while the tensor cores do P_{j-1} V_{j-1}:
// Q K_j^T and that product are issued back to back, S_j is waited for first.
// O is rescaled (for tile j-1's new row max) while Q K_j^T runs, just before
// P_{j-1} V_{j-1} is issued, as in FlashAttention-3; tile 0's S comes before
// the loop and the last P V after it.
//
// The accumulators (o, s, p, row stats) are locals of the function that runs
// both loops: passing them into a separate per-item function changed the
// registers and SASS nvcc produced for persistent OVERLAP variants.
// `last` <- the work item holding this CTA's last ping-pong turn (-1: none has any key); false where the CTA
// has no item. One item per CTA: `it` is that item, decoded once (decoded again after the turn's bar.arrive, a
// memory clobber, it reloaded cu_seqlens).
template <class C>
__device__ __forceinline__ bool last_busy_item(const TileScheduler<C>& sched, Work& it, int& last) {
  last = -1;
  if constexpr (TileScheduler<C>::WARP_WALK) {
    last = sched.last_busy(it);
  } else if constexpr (C::PERSISTENT) {
    for (int r = 0; sched.work_at(r, it); ++r)
      if (!it.skip && it.n_tiles > 0) last = r;
  } else {
    if (!sched.work_at(0, it)) return false;
    if (!it.skip && it.n_tiles > 0) last = 0;
  }
  return true;
}

// The overlapped loop rotated (wait_pv_pack below) for 16-bit tiles: measured on an H200 (benchmarks/
// NOTES.md, session 19) 1.02x on causal D128 and D256 and neutral elsewhere, but 0.94x on e4m3, whose
// tile is softmax-bound: FP8 keeps the unrotated order. P_{j-2} V_{j-2} is waited for at the top of iteration
// j, and S_{j-1} packed into P there, so the loop's back edge lies between that wait and tile j-1's softmax:
// ptxas hoists a wait within a block above the exp2s, which then never overlap the tensor cores' P V. The wait
// is unconditional (nothing in flight at j = 1): inside an `if`, ptxas serialises every wgmma (C7514).
template <class C>
inline constexpr bool ROTATED = C::OVERLAP && !C::FP8;
// TWO_P (config.h): the rotated loop unrolled by two over P registers p and p2 (compile-time names: an array
// indexed by parity would live in local memory). S_j is packed right after its softmax, into the set that
// P_{j-2} V_{j-2} read (waited for at the top of iteration j) while P_{j-1} V_{j-1} reads the other; so s is
// free at the top and Q K_j^T goes right after the wait, with no F2FP before it (the rotated loop's pack).
// The exit test between a pair's tiles is also a block boundary: without it ptxas hoists the second tile's
// wait_group 0 above the first one's exp2s. Each tile's j is hidden from the compiler (an empty volatile asm):
// knowing its parity, it found each half's descriptors loop-invariant, held them all, and ran out of uniform
// registers (R2UR and MOV in the loop).
// Two S sets instead (Q K_j^T into one while S_{j-1} is packed from the other, after it): benchmarks/NOTES.md
// session 23: 224 registers of fragments spill at 240, and a wait_group 1 for a group issued before the
// loop's back edge makes ptxas serialise every wgmma (C7514).
template <class C>
inline constexpr bool TWO_P = ROTATED<C> && C::TWO_P;

// o is written first by tile 0's P V (issue_pv's accumulate), never zeroed: an item without tiles stores zeros
// (the epilogue's `empty`). Zeroing it where no tile is made ptxas serialise the persistent variants' wgmma
// (C7515), and zeroing it always cost ~100 instructions per item. slot(j), phase(j): where this item's K/V
// tile j is in the ring (unsigned: ring + j is never negative where used, and a signed % or / costs a sign
// fix-up). slot_before(j), phase_before(j): tile j - 1's, from tile j's: in a 2-stage ring the other slot, the
// phase flipped where tile j is a round's first; one instruction each where a second slot and phase cost
// five, and the descriptor selects of both tiles then share one predicate.
template <class C>
__device__ __forceinline__ void consumer(const AttnArgs& a, const SmemLayout<C>& sm, const TileScheduler<C>& sched,
                                         int tid, int wg) {
  if constexpr (C::SPLIT_REGS) setmaxnreg_inc<C::CONSUMER_REGS>();
  const int cw = wg - 1;
  // lane unsigned (no sign fix-up in each lane / 4, lane % 4), where one item per CTA: persistent, +36 per item (D128)
  const int warp = (tid % 128) / 32, lane = C::PERSISTENT ? tid % 32 : static_cast<uint32_t>(tid) % 32;
  const StageDescs<C> descs(sm, sm.sQ + cw * 64 * C::SWB);
  const Turns<C> turns{cw};
  int last_busy;
  Work it;
  if (!last_busy_item(sched, it, last_busy)) return;
  turns.start(last_busy >= 0);

  int ring = 0, round = 0;  // K/V tiles consumed so far; items with Q loaded so far
  constexpr bool MAILED = TileScheduler<C>::WARP_WALK;  // items from the Q loader (take_item), not walked here
  for (int r = 0; MAILED ? take_item(sched, sm, cw, round, it) : C::PERSISTENT ? sched.work_at(r, it) : r == 0; ++r) {
    if (it.skip) continue;
    const int m0 = it.m0, n_tiles = it.n_tiles;
    const bool last_work = r == last_busy;
    const int row0 = m0 + cw * 64 + warp * 16 + lane / 4;  // this thread's rows: row0 and row0 + 8
    // The scores' scale: FP8 descales fold into it, a softcap too (common/mask.h).
    const float qk_scale = a.scale * qk_descale<C>(a, it);
    const float scale_log2 = C::Cap::softmax_scale(qk_scale) * LOG2E;
    const float cap_pre = C::Cap::pre_scale(qk_scale);
    float o[C::D / 2];
    float row_max[2] = {NEG_INF, NEG_INF}, row_sum[2] = {0.f, 0.f}, corr[2];
    float s[C::BN / 2];
    uint32_t p[C::BN / C::KSTEP][4], p2[TWO_P<C> ? C::BN / C::KSTEP : 1][4];

    // Tile j of the item is key tile it.n0 + j; a mask where it is partial for this warpgroup's rows.
    const int sq = item_sq<C>(a, it), sk = item_sk<C>(a, it);  // the sequence's (packed) or the call's
    const int kv_first = it.n0 * C::BN, p_lo = m0 + cw * 64 + sk - sq;
    auto needs_mask = [&](int j) { return C::Keys::partial(kv_first + j * C::BN, C::BN, p_lo, p_lo + 63, sk); };
    auto slot = [&](int j) { return static_cast<uint32_t>(ring + j) % C::STAGES; };
    auto phase = [&](int j) { return (static_cast<uint32_t>(ring + j) / C::STAGES) & 1; };
    auto slot_before = [&](int j) -> uint32_t { return C::STAGES == 2 ? slot(j) ^ 1u : slot(j - 1); };
    auto phase_before = [&](int j) -> uint32_t { return C::STAGES == 2 ? phase(j) ^ slot(j) ^ 1u : phase(j - 1); };
    auto release_k = [&](int j) {
      if (lane == 0) mbar_arrive(sm.k_empty(slot(j)));
    };
    auto release_v = [&](int j) {
      if (lane == 0) mbar_arrive(sm.v_empty(slot(j)));
    };
    auto issue_s = [&](int j) {  // S = Q K_j^T, in its ping-pong turn
      mbar_wait(sm.k_full(slot(j)), phase(j));
      turns.acquire();
      wgmma_fence();
      issue_qk<C>(s, descs.query(), descs.key(slot(j)));
      wgmma_commit();
    };
    // S_j waited for: masked where needed, softmaxed in place; `between`: after the row max (softmax_tile).
    auto softmax_s = [&](int j, auto&& between, bool first = false) {
      fence_regs<C::BN / 2>(s);
      release_k(j);
      C::Cap::template apply<C::BN / 2>(s, cap_pre);
      if (needs_mask(j)) mask_tile<C>(s, kv_first + j * C::BN, row0, lane, sq, sk);
      softmax_tile<C>(s, row_max, row_sum, corr, scale_log2, between, first);
    };
    auto nothing = [] {};
    // Issue O += P_j V_j (P packed from S_j, in p or `from`); `at`: V_j's slot.
    auto issue_o = [&](int j, uint32_t at, const uint32_t (*from)[4] = nullptr) {
      wgmma_fence();  // o may just have been written by the rescale
      issue_pv<C>(o, from ? from : p, descs.value(at), j > 0);
      wgmma_commit();
    };
    auto finish_o = [&](int j) {  // every wgmma in flight waited for, O included; V_j's slot is free again
      wgmma_wait<0>();
      fence_regs<C::D / 2>(o);
      release_v(j);
    };

    // ROTATED: P_{j-2} V_{j-2} waited for, S_{j-1} packed (ROTATED above).
    auto wait_pv_pack = [&](int j, bool pack = true) {
      wgmma_wait<0>();
      fence_regs<C::D / 2>(o);
      if (j >= 0) release_v(j);
      if (pack) pack_p<C>(p, s);
    };
    // TWO_P: tile j (j hidden: TWO_P above); P_{j-1} V_{j-1} reads `from`, S_j is packed into `into`.
    auto two_p_tile = [&](int j, uint32_t (*into)[4], const uint32_t (*from)[4]) {
      asm volatile("" : "+r"(j));
      wait_pv_pack(j - 2, false);
      issue_s(j);
      rescale_o<C>(o, corr);
      mbar_wait(sm.v_full(slot_before(j)), phase_before(j));
      issue_o(j - 1, slot_before(j), from);
      turns.release(false);
      wgmma_wait<1>();
      softmax_s(j, nothing);
      pack_p<C>(into, s);
    };

    if constexpr (!MAILED) mbar_wait(sm.q_full(cw), round & 1);
    if (n_tiles > 0) {
      if constexpr (C::OVERLAP) {
        issue_s(0);
        turns.release(false);
        wgmma_wait<0>();
        softmax_s(0, nothing, true);
        if constexpr (!ROTATED<C> || TWO_P<C>) pack_p<C>(p, s);
      }
      for (int j = 1; TWO_P<C> && j < n_tiles; j += 2) {
        two_p_tile(j, p2, p);
        if (j + 1 == n_tiles) break;
        two_p_tile(j + 1, p, p2);
      }
      for (int j = C::OVERLAP ? 1 : 0; !TWO_P<C> && j < n_tiles; ++j) {
        if constexpr (ROTATED<C>) wait_pv_pack(j - 2);
        issue_s(j);
        if constexpr (C::OVERLAP) {
          rescale_o<C>(o, corr);
          mbar_wait(sm.v_full(slot_before(j)), phase_before(j));
          issue_o(j - 1, slot_before(j));
        }
        turns.release(false);
        wgmma_wait<C::OVERLAP ? 1 : 0>();
        if constexpr (C::OVERLAP && !ROTATED<C>) {
          // P_{j-1} V_{j-1} waited for before the exp2s (H200: 1.03x the wait after them; softmax_tile)
          softmax_s(j, [&] { finish_o(j - 1); });
          pack_p<C>(p, s);
        } else {
          softmax_s(j, nothing);
        }
        if constexpr (!C::OVERLAP) {
          rescale_o<C>(o, corr);
          pack_p<C>(p, s);
          mbar_wait(sm.v_full(slot(j)), phase(j));
          turns.acquire();
          issue_o(j, slot(j));
          turns.release(last_work && j == n_tiles - 1);
          finish_o(j);
        }
      }
      if constexpr (C::OVERLAP) {
        if constexpr (ROTATED<C>) wait_pv_pack(n_tiles - 2, !TWO_P<C>);
        if constexpr (TWO_P<C>) copy_p<C>(p, p2, n_tiles % 2 == 0);  // P_{n_tiles-1}: in p2 where odd
        mbar_wait(sm.v_full(slot(n_tiles - 1)), phase(n_tiles - 1));
        turns.acquire();
        rescale_o<C>(o, corr);
        issue_o(n_tiles - 1, slot(n_tiles - 1));
        turns.release(last_work);
        finish_o(n_tiles - 1);
      }
    }
    ring += n_tiles;
    ++round;

    epilogue<C>(o, n_tiles == 0, row_max, row_sum, qk_scale, sm, a, it, cw, tid, warp, lane, row0);
  }
}

}  // namespace fc
