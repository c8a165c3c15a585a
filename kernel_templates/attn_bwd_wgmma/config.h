// Compile-time configuration of the Hopper (sm_90a) wgmma backward template (one instantiation per variant;
// tuner/kernels/render.py writes its arguments). A CTA owns BLOCK_N keys of one K/V head, 64 per consumer
// warpgroup (the M of wgmma), and loops over the query tiles (BLOCK_M rows) of every query head of its GQA group.
#pragma once

#include <stdint.h>

#include <type_traits>

#include "../common/mask.h"
#include "../common/utils.h"

namespace fc {

template <typename T_, int HEAD_DIM_, int BLOCK_M_, int BLOCK_N_, int STAGES_, bool DQ_BULK_, bool PRODUCER_,
          bool DQ_WRITER_, bool CAUSAL_>
struct BwdWgmmaConfig {
  using T = T_;
  static constexpr bool BF16 = std::is_same<T_, __nv_bfloat16>::value;
  static constexpr int D = HEAD_DIM_;
  static constexpr int BM = BLOCK_M_;  // query rows per step of the loop: the N of S^T and dP^T, the K of dV, dK
  static constexpr int BN = BLOCK_N_;  // keys per CTA
  static constexpr int STAGES = STAGES_;  // ring slots of the Q / dO / lse / delta tiles
  static constexpr bool CAUSAL = CAUSAL_;
  // BLOCK_M 80 (FlashAttention-3's D128 tile; wgmma's M is 64, so dQ cannot keep the queries as M): each warpgroup
  // computes dQ^T = K^T dS^T for its 64 of D (M = D, N = the 80 queries, K = the CTA's keys), from dS stored
  // queries x keys (stmatrix.trans of its dS^T into its 64-key column block of one 80-row tile), and dq_accum's
  // blocks are 80 queries x 64 D stored D-major (the dQ^T fragment's rows): dq_index, the row kernels and the
  // lse / delta row padding follow. Only with the tiled dQ writer (DQ_TILED), two consumers, D 128.
  static constexpr bool DQ_T = BM == 80;
  // The warpgroup index broadcast from lane 0 (uniform descriptors), except at BLOCK_M 128 where it spilled.
  static constexpr bool WG_BROADCAST = BM != 128;
  // dQ's blocks reduced into dq_accum by the TMA unit (cp.reduce.async.bulk, a row of 64 fp32 per instruction,
  // from a staging tile in shared memory), else by each thread's vector reductions from registers.
  static constexpr bool DQ_BULK = DQ_BULK_;
  // A producer warpgroup (warpgroup 0) loads the query tiles by TMA into the ring, on mbarriers; else every thread
  // loads the next tile by cp.async and the CTA synchronises once per tile.
  static constexpr bool PRODUCER = PRODUCER_;
  // With a producer: the consumers stage dQ's blocks in shared memory and the producer warpgroup's warps 1..NWG
  // (one per consumer) add them to dq_accum with vector reductions, off the consumers' path (FlashAttention-3's
  // dQ writer); named barriers dq_full(cw, buf) and dq_free(cw, buf) hand each consumer's staging tiles over and
  // back.
  static constexpr bool DQ_WRITER = DQ_WRITER_;
  static constexpr bool DQ_STAGED = DQ_BULK || DQ_WRITER;  // dQ's blocks pass through the staging tiles
  // DQ_WRITER with DQ_BULK: dq_accum laid out in 64 x 64 blocks (dq_index), each 16 KB block one bulk reduction
  // of its staging tile (which then has the same layout); the row kernels read and zero that layout.
  static constexpr bool DQ_TILED = DQ_WRITER && DQ_BULK;
  // DQ_TILED in a two-slot ring: a set of staging tiles per ring slot, so that a consumer stages tile j+1's blocks
  // while the writer's bulk reductions still read tile j's (ncu, one set: 3.6% of the consumers' samples waited for
  // them). The set is the slot: an index the loop already holds (a separate one spilled at D128).
  // BLOCK_M 80: one set (a second, 40 KB, is past the 227 KB of shared memory).
  static constexpr int DQ_BUFS = DQ_TILED && STAGES == 2 && !DQ_T ? 2 : 1;
  // BLOCK_M 80: the one set's block handed over in two halves, D lines 0-31 (the consumer's warps 0-1) and 32-63
  // (warps 2-3), each with its own barriers (the set index of dq_full / dq_free is the half), so that a half is
  // staged again once the writer's bulk reduction has read that half (ncu, one 20 KB hand-over: 3.8% of the
  // samples waited at the staging stores).
  static constexpr int DQ_HALVES = DQ_T ? 2 : 1;
  __device__ __forceinline__ static int dq_full(int cw, int buf) { return 4 + 2 * buf + cw; }  // ids 4 .. 7
  __device__ __forceinline__ static int dq_free(int cw, int buf) { return 8 + 2 * buf + cw; }  // ids 8 .. 11
  // Their threads: a consumer warpgroup (DQ_HALVES: the warps of a half) and its writer warp.
  static constexpr int DQ_SYNC = 128 / DQ_HALVES + 32;
  static constexpr bool CONSUMER_BULK = DQ_BULK && !DQ_WRITER;  // the consumers issue dQ's bulk reductions
  // The consumers read a tile's lse before issuing its S^T and dP^T wgmmas, except with the row-by-row dQ writer
  // on causal tiles, whose consumers would spill the registers that holds.
  static constexpr bool LSE_FIRST = !(DQ_WRITER && !DQ_BULK && CAUSAL);
  // BLOCK_M 80: how many of the tile's 10 8-query blocks of lse are read into registers before the wgmmas (tile.h's
  // PartCols; the rest are read where used): 4 is the most that compiles clean (5: 3 more instructions a tile, 6:
  // 40 bytes spilled, all 10: 192).
  static constexpr int LSE_REGS = DQ_T ? 4 : 0;
  // Causal tiles at BLOCK_M 64 with a producer: the next head's first query row is made again where the tiles wrap
  // (next_tile), not held across the loop, where it was one register too many (consumers at 240, the producer
  // warpgroup at 24: spilled); elsewhere that branch spilled and the row is held.
  static constexpr bool FIRST_ROW_AT_WRAP = CAUSAL && PRODUCER && BM == 64;
  // The consumer's partial and whole query tiles in loops of their own (no mask code in the whole tiles'); else one
  // loop that tests each tile (BLOCK_M 80: two copies of its loop spilled beside 208 accumulators).
  static constexpr bool SPLIT_MASK = BM == 64;
  using Keys = KeyWindow<NoMask, CAUSAL_>;
  static constexpr int MIN_BLOCKS = 1;

  static constexpr int NWG = BN / 64;  // consumer warpgroups, 64 keys each
  static constexpr int THREADS = (NWG + (PRODUCER ? 1 : 0)) * 128;
  // PRODUCER with two consumers (384 threads launch at 168 registers): the producer gives back all but 24, the
  // consumers take 240 (setmaxnreg); with one, 256 threads launch at 255 and nothing moves.
  static constexpr int PRODUCER_REGS = 24;
  static constexpr int CONSUMER_REGS = 240;
  static_assert(!PRODUCER || NWG == 1 || 128 * (PRODUCER_REGS + NWG * CONSUMER_REGS) <= 65536, "register split");
  // A query tile's dQ blocks, shared by the NWG: 64 x 64 (BLOCK_M 80: all 80 rows x 64 D, transposed).
  static constexpr int DQ_BLOCKS = (DQ_T ? 1 : BM / 64) * (D / 64);

  // Shared tiles, 16-bit, in the 128-byte swizzle wgmma reads (column blocks of 64 elements, each R rows x 128
  // bytes, 16-byte chunk c of row r at chunk c ^ (r % 8)); every tile a multiple of 1024 bytes, so each swizzle
  // atom starts 1024-aligned.
  static constexpr int SWB = 128;
  static constexpr int Q_BYTES = BM * D * 2;  // Q or dO tile
  static constexpr int KV_BYTES = BN * D * 2;
  static constexpr int DS_BYTES = 64 * BM * 2;  // one warpgroup's dS^T: 64 keys x BM queries (DQ_T: BM rows x 64 keys)
  static constexpr int DS_SETS = PRODUCER ? 2 : 1;  // PRODUCER: a set per tile parity (no CTA barrier per tile)
  static constexpr int OFF_V = KV_BYTES;
  static constexpr int OFF_Q = 2 * KV_BYTES;
  static constexpr int OFF_DO = OFF_Q + STAGES * Q_BYTES;
  static constexpr int OFF_DS = OFF_DO + STAGES * Q_BYTES;
  static constexpr int OFF_LSE = OFF_DS + DS_SETS * NWG * DS_BYTES;
  static constexpr int OFF_DELTA = OFF_LSE + STAGES * BM * 4;
  // DQ_BULK or DQ_WRITER: a staging tile per dQ block, 64 rows of 64 fp32 at a 72-float stride (a quarter-warp's 8-byte
  // stores to 8 rows hit distinct banks; each row 16-byte aligned for the bulk copy).
  // DQ_TILED: dense rows, 8-column groups swizzled; DQ_T: rows of D, 80 queries each.
  static constexpr int DQS_STRIDE = DQ_T ? 80 : DQ_TILED ? 64 : 72;
  static constexpr int DQS_BYTES = 64 * DQS_STRIDE * 4;
  static constexpr int OFF_DQS = OFF_DELTA + STAGES * BM * 4;
  static constexpr int OFF_BAR = OFF_DQS + (DQ_STAGED ? DQ_BUFS * DQ_BLOCKS * DQS_BYTES : 0);  // PRODUCER: q_full, q_empty
  // 1024 bytes of slack: the dynamic shared window is aligned up to 1024 in the kernel.
  static constexpr int SMEM_BYTES = 1024 + OFF_BAR + (PRODUCER ? 2 * STAGES * 8 : 0);  // = the manifest's

  static_assert(BN % 64 == 0 && BN <= 192, "64 keys per consumer warpgroup, at most 3");
  static_assert((BM % 64 == 0 && BM <= 128) || BM == 80,
                "BLOCK_M: 64 or 128 (wgmma N, dS^T in whole swizzle column blocks), or 80 (dQ transposed)");
  static_assert(!DQ_T || (DQ_TILED && NWG == 2 && D == 128 && STAGES == 2),
                "BLOCK_M 80: the tiled dQ writer, two consumer warpgroups, D 128, two ring slots");
  static_assert(D % 64 == 0 && D <= 128, "head dim 64 or 128 (whole 128-byte swizzle rows)");
  static_assert(STAGES == 1 || STAGES == 2 || (PRODUCER && STAGES == 3), "1 or 2 ring slots (3 with a producer)");
  static_assert(DQ_BLOCKS % NWG == 0, "dQ's 64 x 64 blocks shared evenly by the warpgroups");
  static_assert(!DQ_WRITER || PRODUCER, "the dQ writer is the producer warpgroup's");

  // The per-row kernels (attn_bwd_mma/rows.h, shared with the sm_80 template).
  static constexpr int AUX_THREADS = 128;
  static constexpr int AUX_ROWS = AUX_THREADS / (D / 8);
  static constexpr int ROW_PAD = DQ_T ? 80 : 128;  // lse / delta rows (and DQ_TILED's dq_accum) padded to whole tiles
};

}  // namespace fc
