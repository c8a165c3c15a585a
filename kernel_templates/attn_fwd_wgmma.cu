// FlashAttention-3-style fused attention forward pass for Hopper (sm_90a).
//
// A CTA computes BM = 64 * CONSUMERS query rows of one (batch, head) at a
// time: one such work item per CTA, or (PERSISTENT) about one CTA per SM
// striding over all of them (attn_fwd_wgmma/tile_scheduler.h):
//   * warpgroup 0 is the producer (attn_fwd_wgmma/producer.h): after giving
//     registers back (setmaxnreg), one thread streams K and V tiles with TMA
//     (cp.async.bulk.tensor) into a STAGES-deep shared-memory ring, and
//     another loads each consumer's Q rows once per work item (packed
//     persistent: and posts the item to the consumer, attn_fwd_wgmma/
//     item_mail.h); every copy completes on an mbarrier (full), and consumers
//     free a slot or their Q rows with another (empty).
//   * warpgroups 1..CONSUMERS are consumers, each owning 64 query rows
//     (attn_fwd_wgmma/consumer_mainloop.h, then attn_fwd_wgmma/epilogue.h).
// Tunables (attn_fwd_wgmma/config.h): tile sizes, ring depth, the TMA/wgmma
// swizzle width, softmax overlapped with the next Q K^T inside a warpgroup
// (OVERLAP), ping-pong ordering of the consumers' tensor-core work
// (PINGPONG), how registers are split between producer and consumers
// (PRODUCER_REGS), and the persistent grid (PERSISTENT).
//
// The host encodes one 4-D TMA tensor map per input (D, S, H, B) from the
// element strides, so BHSD, BSHD and GQA need no copy and rows past Sq/Sk
// read as zeros. FP8 (e4m3) inputs take V transposed, [B, Hkv, D, Sk'] with
// the keys of every 16 in wgmma's A-fragment order (config.h, issue_pv), as
// fc_v_transpose_e4m3 (attn_fwd_wgmma/v_transpose.h) copies it, and
// per-(batch, K/V head) descales; O is bf16. Causal masking is bottom-right aligned: query i sees key j
// iff j <= i + (Sk - Sq). Rows that see no key produce 0 and lse = -inf. Packed sequences (PACKED,
// 16-bit): [total, H, D] tensors with cumulative lengths, each sequence its own Sq, Sk and alignment.

#include "attn_fwd_wgmma/config.h"
#include "attn_fwd_wgmma/consumer_mainloop.h"
#include "attn_fwd_wgmma/epilogue.h"
#include "attn_fwd_wgmma/producer.h"
#include "attn_fwd_wgmma/tile_scheduler.h"
#include "attn_fwd_wgmma/v_transpose.h"
#include "common/attn_args.h"
#include "common/utils.h"

namespace fc {

template <class C>
__device__ __forceinline__ void attn_fwd_wgmma(const TmaDesc& tq, const TmaDesc& tk, const TmaDesc& tv,
                                               const AttnArgs& a) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const SmemLayout<C> sm(smem_raw);

  const int tid = threadIdx.x;
  // Broadcast from lane 0 so that ptxas can prove the warpgroup index warp-uniform (CUTLASS's
  // canonical_warp_group_idx): the per-consumer shared-memory descriptors then live in uniform
  // registers, with no R2UR before each wgmma.
  const int wg = __shfl_sync(0xffffffff, tid / 128, 0);
  const TileScheduler<C> sched(a);

  if (tid == 0) sm.init_barriers();
  __syncthreads();

  if (wg == 0) {
    producer<C>(tq, tk, tv, a, sm, sched, tid);
    return;
  }
  consumer<C>(a, sm, sched, tid, wg);
}

}  // namespace fc

// The tuner appends, for one variant (tuner/kernels/render.py):
//   using TunerCfg = fc::HopperConfig<...>;
//   extern "C" __global__ void __launch_bounds__(TunerCfg::THREADS, TunerCfg::MIN_BLOCKS) <name>(ATTN_FWD_PARAMS)
//   { ATTN_FWD_BODY(TunerCfg) }
// The three tensor maps come first (64-byte aligned parameters), then the
// same tensor arguments as the sm_80 template, then heads and batch, then
// the three descale pointers (null unless FP8); q, k, v and their strides are
// read through the maps only.
#define ATTN_FWD_PARAMS                                                                                        \
  const __grid_constant__ fc::TmaDesc tmap_q, const __grid_constant__ fc::TmaDesc tmap_k,                      \
      const __grid_constant__ fc::TmaDesc tmap_v, ATTN_FWD_TENSOR_PARAMS, int heads, int batch,                \
      const float *q_descale, const float *k_descale, const float *v_descale

#define ATTN_FWD_BODY(CFG)                                        \
  fc::AttnArgs args = ATTN_FWD_ARGS(heads, batch);                \
  args.q_descale = q_descale;                                     \
  args.k_descale = k_descale;                                     \
  args.v_descale = v_descale;                                     \
  fc::attn_fwd_wgmma<CFG>(tmap_q, tmap_k, tmap_v, args);

// Packed sequences (HopperConfig's PACKED): the cumulative sequence lengths follow, int32 [batch + 1]
// each (FlashAttention's cu_seqlens_q / cu_seqlens_k); the maps and strides are of [1, H, total, D]
// views, sq and sk the longest sequence's lengths, batch the number of sequences.
#define ATTN_FWD_PARAMS_PACKED ATTN_FWD_PARAMS, const int *cu_seqlens_q, const int *cu_seqlens_k

#define ATTN_FWD_BODY_PACKED(CFG)                                 \
  fc::AttnArgs args = ATTN_FWD_ARGS(heads, batch);                \
  args.cu_q = cu_seqlens_q;                                       \
  args.cu_k = cu_seqlens_k;                                       \
  fc::attn_fwd_wgmma<CFG>(tmap_q, tmap_k, tmap_v, args);
